"""A subject dataset's journey over HTTP against the whole platform: a private upload whose
privacy unit is ``subject`` → a DP finetune of the tiny model → the worker trained
user-level DP-SGD: its Poisson sampler ranged over the subjects at exactly the ledger's q,
and the budget counts subjects."""

from __future__ import annotations

import json
import math
import tarfile

import numpy as np
import pytest

from tests.e2e.conftest import CLASSES, digits_npz, finetune_spec
from tests.e2e.ledger_replay import ledger_entries
from tests.support.models import tiny_model_archive

SUBJECTS = 15


@pytest.fixture(scope="module")
def journey(platform, client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("subjects")
    base = client.upload_model(tiny_model_archive(tmp / "model.tar", class_names=CLASSES),
                               name="tiny-base")["model_id"]
    npz, _ = digits_npz(tmp / "private.npz", part="private", n=45)
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    # 15 subjects with 3 images each, ids as strings (remapped at ingest, never stored)
    arrays["patient"] = np.asarray([f"patient-{i % SUBJECTS:03d}" for i in range(45)])
    np.savez(npz, **arrays)
    dataset = client.upload_dataset(npz, name="by-patient", visibility="private",
                                    epsilon_limit=10.0, label_domain=CLASSES,
                                    privacy_unit="subject", subject_column="patient",
                                    declared_size=SUBJECTS)
    spec = finetune_spec(dataset["dataset_id"], base, target_epsilon=4.0,
                         expected_batch_size=5, epochs=1.0, checkpoint_every=2)
    spec["training"]["max_images_per_subject"] = 2
    plan = client.submit_job(spec, dry_run=True)
    job = client.wait_for_job(client.submit_job(spec)["job_id"], timeout=900)
    return {"dataset": dataset, "plan": plan, "job": job}


def test_the_budget_counts_subjects(journey, client):
    ds = journey["dataset"]
    assert ds["privacy_unit"] == "subject" and ds["declared_size"] == SUBJECTS
    budget = client.get_budget(ds["dataset_id"])
    assert budget["declared_size"] == SUBJECTS and budget["privacy_unit"] == "subject"
    plan = journey["plan"]["plan"]
    assert plan["sample_rate"] == 5 / SUBJECTS
    assert plan["steps"] == math.ceil(SUBJECTS / 5)


def test_the_worker_sampled_subjects_at_the_ledgers_rate(journey, platform, client, tmp_path):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    ckpts = [a for a in client.job_artifacts(job["job_id"]) if a["kind"] == "checkpoint"]
    last = max(ckpts, key=lambda a: a.get("checkpoint_step") or 0)
    client.download_artifact(last["artifact_id"], tmp_path / "ckpt.tar")
    with tarfile.open(tmp_path / "ckpt.tar") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("trainer_state.json"))
        state = json.loads(tar.extractfile(member).read())
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token,
                             journey["dataset"]["dataset_id"])
    accepted = next(e for e in entries if e["kind"] == "reservation_accepted"
                    and e["payload"]["job_id"] == job["job_id"])
    assert state["sampler"]["unit"] == "subject"
    assert state["sampler"]["num_records"] == SUBJECTS
    assert state["sampler"]["max_images_per_subject"] == 2
    assert state["sampler"]["sample_rate_hex"] == float(
        accepted["payload"]["event"]["sample_rate"]).hex()
    assert state["step"] == job["privacy"]["steps"]
