"""The embedded platform (`dpsynth up`), stopped and started mid-way, keeps its datasets,
jobs and ledger: same ids, same budget figures, the chain still verifies, and the journey
continues after the restart."""

from __future__ import annotations

import json

import pytest
from dpsynth_cli.embedded import EmbeddedPlatform
from dpsynth_client import Client

from tests.e2e.conftest import CLASSES, FAST_ENV, digits_npz, finetune_spec
from tests.support.models import tiny_model_archive


@pytest.fixture()
def embedded(tmp_path):
    platform = EmbeddedPlatform(tmp_path / "home", workers=0, extra_env=FAST_ENV)
    yield platform
    platform.stop()


def test_restart_keeps_datasets_jobs_and_ledger(embedded, tmp_path):
    embedded.start()
    creds_file = embedded.credentials_file
    assert oct(creds_file.stat().st_mode & 0o777) == "0o600"
    creds = json.loads(creds_file.read_text())
    client = Client(creds["api_url"], creds["api_key"])
    npz, _ = digits_npz(tmp_path / "priv.npz", part="private", n=120)
    ds = client.upload_dataset(npz, name="priv", visibility="private", epsilon_limit=5.0,
                               label_domain=CLASSES, declared_size=120)
    model = client.upload_model(tiny_model_archive(tmp_path / "m.tar", class_names=CLASSES),
                                name="tiny")
    job = client.submit_job(finetune_spec(ds["dataset_id"], model["model_id"], target_epsilon=1.0))
    before = client.get_budget(ds["dataset_id"])
    assert before["rdp_reserved"] > 0

    embedded.stop()
    embedded.start()
    creds_after = json.loads(creds_file.read_text())
    assert creds_after["api_key"] == creds["api_key"]  # the key was not regenerated
    client = Client(creds_after["api_url"], creds_after["api_key"])
    assert client.get_dataset(ds["dataset_id"])["dataset_id"] == ds["dataset_id"]
    assert client.get_model(model["model_id"])["model_id"] == model["model_id"]
    kept = client.get_job(job["job_id"])
    assert kept["state"] == "queued"
    after = client.get_budget(ds["dataset_id"])
    for key in ("epsilon_limit", "delta", "admission_order", "rdp_budget", "rdp_reserved",
                "rdp_spent", "dataset_epsilon_spent"):
        assert after[key] == before[key], key
    assert len(after["history"]) == len(before["history"])
    # The platform keeps working after the restart: cancelling releases the reservation.
    client.cancel_job(job["job_id"])
    assert client.get_budget(ds["dataset_id"])["rdp_reserved"] == pytest.approx(0.0, abs=1e-15)
