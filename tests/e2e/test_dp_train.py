"""Direct DP training over HTTP against the whole platform (issue 20): a private upload →
a ``dp_train`` job of the evaluation's CNN → the worker trains it under leases with the
ledger's numbers → a downloadable DP classifier with its epsilon, charged to the budget,
that has learnt the private digits."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from dpsynth_worker.runners.artifacts import PROVENANCE_FILE

from tests.e2e.conftest import CLASSES, digits_npz

N = 600


@pytest.fixture(scope="module")
def trained(platform, client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp_train")
    npz, _ = digits_npz(tmp / "private.npz", part="private", n=N)
    dataset = client.upload_dataset(npz, name="digits-private", visibility="private",
                                    epsilon_limit=30.0, label_domain=CLASSES, declared_size=N)
    spec = {"type": "dp_train", "dataset_id": dataset["dataset_id"],
            # a large epsilon: a functional check that the private data is learnt, not a
            # benchmark (docs/benchmarks.md has the direct-DP rows)
            "privacy": {"target_epsilon": 16.0, "max_grad_norm": 1.0},
            "training": {"architecture": "cnn", "image_size": 8, "expected_batch_size": 120,
                         "epochs": 8, "learning_rate": 0.003, "checkpoint_every": 10,
                         "max_physical_batch_size": 128}}
    plan = client.submit_job(spec, dry_run=True)
    job = client.wait_for_job(client.submit_job(spec)["job_id"], timeout=900)
    return {"dataset": dataset, "plan": plan, "job": job, "tmp": tmp, "private": npz}


def test_the_job_is_charged_like_one_dp_sgd_run(trained, client):
    job, plan = trained["job"], trained["plan"]["plan"]
    assert job["state"] == "succeeded", job
    assert plan["sample_rate"] == 120 / N and plan["steps"] == 40
    assert job["result"]["job_epsilon"] <= 16.0 + 1e-9
    budget = client.get_budget(trained["dataset"]["dataset_id"])
    assert budget["dataset_epsilon_spent"] > 0


def test_the_classifier_downloads_and_has_learnt_the_private_digits(trained, client):
    from dpsynth_ml import load_classifier
    from dpsynth_ml.evaluation.classifiers import classifier_accuracy

    model_id = trained["job"]["result"]["model_id"]
    view = client.get_model(model_id)
    assert view["dp"] is True and view["info"]["model_kind"] == "classifier"
    assert view["job_epsilon"] == trained["job"]["result"]["job_epsilon"]
    tmp = trained["tmp"]
    archive = client.download_model(model_id, tmp / "classifier.zip")
    folder = tmp / "classifier"
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(folder)
    model, info = load_classifier(folder)
    assert info["dp"]["steps"] == 40 and info["rng"] == "os"
    provenance = json.loads((folder / PROVENANCE_FILE).read_text())
    assert provenance["dp"] is True and provenance["model_kind"] == "classifier"
    assert provenance["reservation_ids"] and provenance["job_ids"] == [trained["job"]["job_id"]]
    # a functional check that the private records were learnt (10 classes: chance is 0.1),
    # not a benchmark (docs/benchmarks.md has those)
    with np.load(trained["private"]) as data:
        learnt = classifier_accuracy(model.eval(), data["images"], data["labels"])
    test_npz, labels = digits_npz(tmp / "test.npz", part="test")
    with np.load(test_npz) as data:
        held_out = classifier_accuracy(model.eval(), data["images"], labels)
    assert learnt > 0.3, (learnt, held_out)
