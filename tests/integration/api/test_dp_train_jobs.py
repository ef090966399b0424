"""Admitting ``dp_train`` jobs (issue 20) against a real PostgreSQL (in-memory ledger): a
private dataset, one DP-SGD reservation like a whole-dataset finetune; the classifier it
registers is a DP model of the dataset, and never a diffusion base or a sampled model."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, auth


def _submit(api: Api, token: str, dataset: str, *, dry: bool = False,
            **training: Any) -> Any:
    return api.client.post("/v1/jobs" + ("?dry_run=true" if dry else ""), headers=auth(token),
                           json={"type": "dp_train", "dataset_id": dataset,
                                 "privacy": {"target_epsilon": 1.0},
                                 "training": {"expected_batch_size": 4, "epochs": 1,
                                              "image_size": 8, **training}})


def test_a_dp_train_job_reserves_one_dp_sgd_run_on_a_private_dataset(api: Api) -> None:
    _, token = api.tenant()
    private = api.private_dataset(token)  # N̂ = 12
    plan = _submit(api, token, private, dry=True)
    assert plan.status_code == 200, plan.text
    made = _submit(api, token, private)
    assert made.status_code == 201, made.text
    job = made.json()
    privacy = job["privacy"]
    assert job["type"] == "dp_train" and privacy["reservation_id"]
    assert privacy["sample_rate"] == 4 / 12 and privacy["steps"] == 3  # 1 epoch of N̂/B
    assert privacy["job_epsilon"] == 1.0
    # public data needs no DP; a batch above N̂ is no sample rate
    public = api.public_dataset(token, {"a": 3, "b": 3})
    r = _submit(api, token, public)
    assert (r.status_code, r.json()["code"]) == (422, "visibility_mismatch")
    r = _submit(api, token, private, expected_batch_size=13)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_spec")
    r = _submit(api, token, private, architecture="resnet152")
    assert r.status_code == 422


def test_its_classifier_is_a_dp_model_and_no_diffusion_base(api: Api) -> None:
    _, token = api.tenant()
    private = api.private_dataset(token)
    job_id = _submit(api, token, private).json()["job_id"]
    claim = api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    assert claim.json()["type"] == "dp_train" and claim.json()["reservation_id"]
    registered = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "e" * 64, "size": 10,
        "metadata": {"job_epsilon": 0.9, "model_kind": "classifier", "architecture": "cnn",
                     "training_kind": "dp_train", "class_names": ["a", "b"],
                     "image_size": 8, "channels": 1}})
    assert registered.status_code == 201, registered.text
    model_id = registered.json()["model_id"]
    view = api.client.get(f"/v1/models/{model_id}", headers=auth(token)).json()
    assert view["dp"] is True and view["job_epsilon"] == 0.9
    assert view["info"]["model_kind"] == "classifier"
    # a classifier is no diffusion model: not a finetune base, not sampled
    r = api.finetune(token, private, model_id)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_spec")
    assert "classifier" in r.json()["detail"]
    r = api.client.post("/v1/jobs", headers=auth(token), json={
        "type": "generate", "model_id": model_id, "samples_per_class": 1})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_spec")
