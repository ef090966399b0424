"""No public data, over HTTP against the whole platform (issue 18, item 3): an
``initialise_only`` pretrain (a seeded, untrained pixel model) → a private upload with
declared class sizes → a finetune with the DP central-image warm-up. The ledger calibrated
the release before the worker read any data and charged it as its own event, once to every
training partition; an independent replay of the chain (opacus) reproduces the accounts;
the model's epsilon composes the release with the DP-SGD steps; the model ships the released
images (DP outputs) and the manifest records the mechanism.
"""

from __future__ import annotations

import json
import zipfile
from collections import Counter

import pytest

from tests.e2e.conftest import CLASSES, digits_npz, upload_npz
from tests.e2e.ledger_replay import (
    conversion,
    ledger_entries,
    replay_accumulators,
    verify_chain,
)

TARGET, RELEASE = 3.0, 1.0


@pytest.fixture(scope="module")
def journey(platform, client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("central-images")
    init = client.submit_job({"type": "pretrain", "initialise_only": True,
                              "class_names": CLASSES, "space": "pixel", "preset": "tiny",
                              "image_size": 16, "seed": 0})
    init = client.wait_for_job(init["job_id"], timeout=600)
    npz, labels = digits_npz(tmp / "private.npz", part="private", n=60)
    counts = Counter(str(int(y)) for y in labels)
    sizes = {c: counts.get(c, 0) + 2 for c in CLASSES}  # public bounds, each ≥ the true count
    metadata = {"name": "priv-central", "visibility": "private", "epsilon_limit": 10.0,
                "label_domain": CLASSES, "class_sizes": sizes, "declared_size": 60}
    dataset = upload_npz(platform, npz, metadata)
    spec = {"type": "finetune", "dataset_id": dataset["dataset_id"],
            "base_model_id": init["result"]["model_id"],
            "privacy": {"target_epsilon": TARGET, "max_grad_norm": 1.0},
            "training": {"trainable": "full", "expected_batch_size": 8, "epochs": 1.0,
                         "learning_rate": 3e-4, "max_physical_batch_size": 8,
                         "checkpoint_every": 4,
                         "central_images": {"target_epsilon": RELEASE, "downsample": 2,
                                            "sample_rate": 0.5, "queries": 2,
                                            "warmup_steps": 3, "warmup_batch_size": 8}}}
    job = client.submit_job(spec)
    job = client.wait_for_job(job["job_id"], timeout=900)
    return {"init": init, "dataset": dataset, "job": job, "tmp": tmp}


def test_the_initial_model_is_untrained_and_public(journey, client):
    init = journey["init"]
    assert init["state"] == "succeeded", init
    assert init["dataset_id"] is None
    model = client.get_model(init["result"]["model_id"])
    assert model["dp"] is False and model["info"]["space"] == "pixel"


def test_the_release_was_charged_once_before_any_step(journey, platform, client):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    ds_id = journey["dataset"]["dataset_id"]
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, ds_id)
    kinds = [e["kind"] for e in entries]
    (release,) = [e for e in entries if e["kind"] == "central_images_released"]
    first_lease = kinds.index("lease_granted")
    assert kinds.index("read_grant") < kinds.index("central_images_released") < first_lease
    payload = release["payload"]
    assert payload["event"]["kind"] == "dp_sgd" and payload["event"]["steps"] == 2
    assert payload["bound"] == pytest.approx(0.5 * 8)  # 16x16 downsampled 2x, one channel
    assert payload["epsilon"] <= RELEASE + 1e-9
    assert set(payload["rdp_delta"]) == {"*", *CLASSES}  # every training partition, once
    budget = client.get_budget(ds_id)
    replayed = replay_accumulators(entries)
    assert replayed == pytest.approx(budget["partitions"], rel=1e-9)
    assert budget["dataset_epsilon_spent"] == pytest.approx(
        conversion(max(replayed.values()), budget["admission_order"], budget["delta"]),
        rel=1e-9)
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]


def test_the_model_epsilon_composes_the_release(journey, client):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    dp_sgd_alone = job["privacy"]["job_epsilon"]  # the reservation's planned DP-SGD figure
    assert job["result"]["job_epsilon"] > dp_sgd_alone
    path = client.download_model(job["result"]["model_id"], journey["tmp"] / "model.zip")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        info = json.loads(zf.read(next(n for n in names if n.endswith("dpsynth_model.json"))))
        provenance = json.loads(zf.read(next(n for n in names
                                             if n.endswith("dpsynth_provenance.json"))))
    assert any(n.endswith("central_images.npz") for n in names)
    assert any(n.endswith("central_images.png") for n in names)
    assert info["space"] == "pixel" and info["extra"]["central_images"]["queries"] == 2
    record = provenance["central_images"]
    assert record["event"]["kind"] == "dp_sgd" and len(record["release_ids"]) == 1
    assert provenance["job_epsilon"] == job["result"]["job_epsilon"]
