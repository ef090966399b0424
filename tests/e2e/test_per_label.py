"""The per-label journey over HTTP (DP-DocLDM's setting) against the whole platform:

private upload with declared class sizes → per-label finetune of the tiny model (one
DP-trained denoiser per class) → a model bundle with one denoiser per class → generate
every class from its own denoiser. The ledger charged each class's steps to that class's
partition only; an independent replay of the chain (opacus) reproduces every partition.
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
from tests.support.models import tiny_model_archive

TARGET = 3.0


@pytest.fixture(scope="module")
def journey(platform, client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("per-label")
    base = client.upload_model(tiny_model_archive(tmp / "model.tar", class_names=CLASSES),
                               name="tiny-base")["model_id"]
    npz, labels = digits_npz(tmp / "private.npz", part="private", n=60)
    counts = Counter(str(int(y)) for y in labels)
    sizes = {c: counts.get(c, 0) + 2 for c in CLASSES}  # public bounds, each ≥ the true count
    metadata = {"name": "priv-per-label", "visibility": "private", "epsilon_limit": 10.0,
                "label_domain": CLASSES, "class_sizes": sizes, "declared_size": 60}
    dataset = upload_npz(platform, npz, metadata)
    spec = {"type": "finetune", "dataset_id": dataset["dataset_id"], "base_model_id": base,
            "privacy": {"target_epsilon": TARGET, "max_grad_norm": 1.0},
            "training": {"per_label": True, "trainable": "attention", "expected_batch_size": 4,
                         "epochs": 1.0, "learning_rate": 3e-4, "max_physical_batch_size": 8,
                         "checkpoint_every": 2}}
    plan = client.submit_job(spec, dry_run=True)
    job = client.submit_job(spec)
    job = client.wait_for_job(job["job_id"], timeout=900)
    return {"dataset": dataset, "sizes": sizes, "plan": plan, "job": job, "tmp": tmp}


def test_the_dataset_shows_its_declared_class_sizes(journey, client):
    ds = client.get_dataset(journey["dataset"]["dataset_id"])
    assert ds["class_sizes"] == journey["sizes"]
    assert client.get_budget(ds["dataset_id"])["class_sizes"] == journey["sizes"]


def test_dry_run_showed_each_classs_run(journey):
    plan, sizes = journey["plan"]["plan"], journey["sizes"]
    assert set(plan["per_label"]) == set(CLASSES)
    for c, part in plan["per_label"].items():
        batch = min(4, sizes[c])
        assert part["expected_batch_size"] == batch
        assert part["sample_rate"] == batch / sizes[c]
        assert 0 < part["job_epsilon"] <= TARGET
    assert journey["plan"]["steps"] == sum(p["steps"] for p in plan["per_label"].values())


def test_the_per_label_finetune_charges_each_class_to_its_own_partition(journey, platform,
                                                                        client):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    ds_id = journey["dataset"]["dataset_id"]
    budget = client.get_budget(ds_id)
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, ds_id)
    leases = [e for e in entries if e["kind"] == "lease_granted"]
    assert leases and all(e["payload"].get("per_label") for e in leases)
    assert {e["payload"]["label"] for e in leases} == set(CLASSES)
    for c in CLASSES:  # each class's steps, numbered from 0, cover its reserved steps
        mine = [e["payload"] for e in leases if e["payload"]["label"] == c]
        assert mine[0]["start_step"] == 0
        assert sum(p["steps"] for p in mine) == job["privacy"]["per_label"][c]["steps"]
        assert set().union(*(p["rdp_delta"] for p in mine)) == {c}
    replayed = replay_accumulators(entries)
    assert replayed == pytest.approx(budget["partitions"], rel=1e-9)
    assert budget["partitions"]["*"] == 0.0
    order, delta = budget["admission_order"], budget["delta"]
    assert budget["dataset_epsilon_spent"] == pytest.approx(
        conversion(max(replayed.values()), order, delta), rel=1e-9)
    assert budget["rdp_reserved"] == pytest.approx(0.0, abs=1e-15)
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]
    assert 0 < job["result"]["job_epsilon"] <= TARGET + 1e-9


def test_the_model_bundles_one_denoiser_per_class(journey, client):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    path = client.download_model(job["result"]["model_id"], journey["tmp"] / "model.zip")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        info = json.loads(zf.read(next(n for n in names
                                       if n.endswith("dpsynth_model.json"))))
        provenance = json.loads(zf.read(next(n for n in names
                                             if n.endswith("dpsynth_provenance.json"))))
    assert info["extra"]["per_label"] is True
    assert set(info["extra"]["denoisers"]) == set(CLASSES)
    for rel in info["extra"]["denoisers"].values():
        assert any(n.startswith(f"{rel}/unet/") or f"/{rel}/unet/" in n for n in names), rel
    assert set(provenance["per_label"]) == set(CLASSES)
    privacy = job["privacy"]["per_label"]
    for c, rec in provenance["per_label"].items():
        assert rec["noise_multiplier"] == privacy[c]["noise_multiplier"]
        assert rec["sample_rate"] == privacy[c]["sample_rate"]
        assert rec["steps"] == privacy[c]["steps"]
        assert 0 < rec["job_epsilon"] <= TARGET + 1e-9
    assert provenance["job_epsilon"] == pytest.approx(
        max(rec["job_epsilon"] for rec in provenance["per_label"].values()))


def test_generate_draws_every_class_from_its_own_denoiser(journey, client):
    job = journey["job"]
    assert job["state"] == "succeeded", job
    gen = client.submit_job({"type": "generate", "model_id": job["result"]["model_id"],
                             "samples_per_class": 2, "sampler": "ddim", "steps": 4,
                             "seed": 0})
    gen = client.wait_for_job(gen["job_id"], timeout=600)
    assert gen["state"] == "succeeded", gen
    corpus = next(a for a in client.job_artifacts(gen["job_id"]) if a["kind"] == "corpus")
    zip_path = journey["tmp"] / "corpus.zip"
    client.download_artifact(corpus["artifact_id"], zip_path)
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
    for c in CLASSES:
        assert len([n for n in names if n.startswith(f"{c}/") and n.endswith(".png")]) == 2
