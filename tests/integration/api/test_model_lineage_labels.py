"""The model view labels a composed ``job_epsilon`` (issue 13, item 8), on real PostgreSQL.

A model fine-tuned from a DP ancestor on the same budget reports the PLD composition of its
lineage: the view labels it as not a guarantee under adaptive use and shows the filter figure
(``dataset_epsilon_spent`` when the model was made) beside it. Before the fix the view had
neither field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dpsynth_shared.ledger_contract import LINEAGE_LABEL

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b


def _private(api: Api, token: str) -> str:
    images = np.random.default_rng(77).integers(0, 256, size=(20, 8, 8), dtype=np.uint8)
    r = api.upload(token, b.npz_bytes(images=images, labels=np.arange(20) % 3), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0, "declared_size": 40,
        "label_domain": ["x", "y", "z"]}, filename="d.npz")
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def _train(api: Api, token: str, dataset_id: str, base: str, eps: float, spent: float,
           label: str | None = None) -> tuple[str, str]:
    """Run one finetune through the worker endpoints, reporting what the worker reports;
    (job id, model id)."""
    job = api.finetune(token, dataset_id, base, batch=2)
    assert job.status_code == 201, job.text
    job_id = job.json()["job_id"]
    api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    meta: dict[str, Any] = {"job_epsilon": eps, "dataset_epsilon_spent": spent}
    out = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "model", "object_key": f"models/{job_id}/model.tar",
        "sha256": "f" * 64, "size": 10, "metadata": meta})
    assert out.status_code in (200, 201), out.text
    model_id = str(out.json()["model_id"])
    r = api.worker(f"{job_id}/transition", {
        "attempt": 1, "to_state": "succeeded",
        "result": {"model_id": model_id, "job_epsilon": eps, "dataset_epsilon_spent": spent,
                   "job_epsilon_label": label}})
    assert r.status_code in (200, 204), r.text
    return job_id, model_id


def test_a_model_with_a_dp_ancestor_shows_the_label_and_the_filter_figure(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token)
    public_base = api.model(token)
    first_job, first = _train(api, token, dataset, public_base, eps=0.9, spent=1.4)
    second_job, second = _train(api, token, dataset, first, eps=1.2, spent=2.6,
                                label=LINEAGE_LABEL)

    alone = api.client.get(f"/v1/models/{first}", headers=auth(token)).json()
    assert alone["job_ids"] == [first_job] and alone["job_epsilon"] == 0.9
    assert alone["job_epsilon_label"] is None  # one run, chosen before it ran
    assert alone["dataset_epsilon_spent"] == 1.4

    view = api.client.get(f"/v1/models/{second}", headers=auth(token)).json()
    assert view["job_ids"] == [first_job, second_job] and view["job_epsilon"] == 1.2
    assert view["job_epsilon_label"] == LINEAGE_LABEL
    assert "not a guarantee under adaptive use" in view["job_epsilon_label"]
    assert view["dataset_epsilon_spent"] == 2.6
    listed = api.client.get("/v1/models", headers=auth(token)).json()["items"]
    assert {m["model_id"]: m["job_epsilon_label"] for m in listed}[second] == LINEAGE_LABEL

    job = api.client.get(f"/v1/jobs/{second_job}", headers=auth(token)).json()
    assert job["result"]["job_epsilon_label"] == LINEAGE_LABEL
    assert job["result"]["dataset_epsilon_spent"] == 2.6

    uploaded = api.client.get(f"/v1/models/{public_base}", headers=auth(token)).json()
    assert uploaded["job_epsilon_label"] is None and uploaded["dataset_epsilon_spent"] is None
