"""DP-DocLDM's recipe end to end against the whole platform (real processes):

public generated documents with their layout masks → layout-conditioned pretraining → a
private document dataset (with masks and declared class sizes) → per-label DPDM finetune with
noise multiplicity → generation with DPM-Solver++ conditioned on PUBLIC layouts. Private
layouts are refused before anything runs.
"""

from __future__ import annotations

import json
import zipfile
from collections import Counter

import httpx
import pytest
from dpsynth_shared.documents import CLASS_NAMES, write_npz

CLASSES = list(CLASS_NAMES[:4])  # letter, form, invoice, memo: keeps the job short


@pytest.fixture(scope="module")
def recipe(platform, client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docldm")
    public = client.upload_dataset(write_npz(tmp / "public.npz", 16, size=16, seed=0,
                                             classes=CLASSES),
                                   name="public documents", visibility="public")
    assert public["has_masks"] is True
    pretrain = client.submit_job({"type": "pretrain", "dataset_id": public["dataset_id"],
                                  "preset": "tiny", "image_size": 16, "channels": 1,
                                  "layout_conditioning": True, "epochs": 1, "batch_size": 32,
                                  "seed": 0})
    pretrain = client.wait_for_job(pretrain["job_id"], timeout=900)
    assert pretrain["state"] == "succeeded", pretrain
    private_path = write_npz(tmp / "private.npz", 5, size=16, seed=1, classes=CLASSES)
    private = client.upload_dataset(private_path, name="private documents",
                                    visibility="private", epsilon_limit=10.0,
                                    label_domain=CLASSES,
                                    class_sizes={c: 6 for c in CLASSES},
                                    declared_size=6 * len(CLASSES))
    spec = {"type": "finetune", "dataset_id": private["dataset_id"],
            "base_model_id": pretrain["result"]["model_id"],
            "privacy": {"target_epsilon": 5.0, "max_grad_norm": 0.5},
            "training": {"per_label": True, "trainable": "attention",
                         "noise_multiplicity": 2, "expected_batch_size": 3, "epochs": 1.0,
                         "max_physical_batch_size": 8, "ema_decay": 0.9}}
    finetune = client.wait_for_job(client.submit_job(spec)["job_id"], timeout=900)
    return {"tmp": tmp, "public": public, "private": private, "finetune": finetune}


def _generate(client, model_id: str, layout_dataset: str) -> dict:
    return {"type": "generate", "model_id": model_id, "samples_per_class": 2,
            "sampler": "dpm_solver++", "steps": 4, "batch_size": 3,
            "layout_source": {"dataset_id": layout_dataset}, "seed": 0}


def test_private_layouts_are_refused_before_anything_runs(recipe, platform):
    finetune = recipe["finetune"]
    assert finetune["state"] == "succeeded", finetune
    spec = _generate(None, finetune["result"]["model_id"], recipe["private"]["dataset_id"])
    r = httpx.post(f"{platform.api_url}/v1/jobs", json=spec, timeout=60,
                   headers={"Authorization": f"Bearer {platform.admin_key()}"})
    assert r.status_code == 422 and r.json()["code"] == "private_conditioning_refused", r.text
    assert "unbounded" in r.json()["detail"]


def test_the_recipe_runs_and_its_corpus_records_the_public_layouts(recipe, client):
    finetune = recipe["finetune"]
    assert finetune["state"] == "succeeded", finetune
    assert set(finetune["privacy"]["per_label"]) == set(CLASSES)
    model = client.get_model(finetune["result"]["model_id"])
    assert 0 < model["job_epsilon"] <= 5.0 + 1e-9
    gen = client.submit_job(_generate(client, finetune["result"]["model_id"],
                                      recipe["public"]["dataset_id"]))
    gen = client.wait_for_job(gen["job_id"], timeout=600)
    assert gen["state"] == "succeeded", gen
    assert gen["result"]["images_per_second"] > 0
    assert gen["result"]["sampler"] == "dpm_solver++"
    corpus = next(a for a in client.job_artifacts(gen["job_id"]) if a["kind"] == "corpus")
    path = client.download_artifact(corpus["artifact_id"], recipe["tmp"] / "corpus.zip")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("manifest.json"))
    pngs = Counter(n.split("/")[0] for n in names if n.endswith(".png"))
    assert pngs == {c: 2 for c in CLASSES}
    layout = manifest["layout_source"]
    assert layout["dataset_id"] == recipe["public"]["dataset_id"]
    assert layout["visibility"] == "public" and layout["declared_public_by"]
    assert layout["masks_used"] == 2 * len(CLASSES)
    assert manifest["per_label"] is True and manifest["guidance_applied"] is False
