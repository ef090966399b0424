"""Per-label finetunes at the api: declared class sizes at upload, the per-class plan.

The first tests use the in-memory ledger; the last one wires the api to the REAL ledger
(its app on its own PostgreSQL database, over HTTP through ``HttpLedger``), so the dry run
shows calibrated per-class figures.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b

SIZES = {"x": 5, "y": 4, "z": 6}  # the 12 records are 4 per class


def _private(api: Api, token: str, **meta: Any) -> Any:
    return api.upload(token, b.digits_npz(12, k=3), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["x", "y", "z"], "declared_size": 12, **meta}, filename="d.npz")


def _per_label_spec(dataset_id: str, model_id: str, *, epsilon: float = 2.0,
                    batch: int = 5, epochs: float = 2.0) -> dict[str, Any]:
    return {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
            "privacy": {"target_epsilon": epsilon},
            "training": {"per_label": True, "expected_batch_size": batch, "epochs": epochs}}


def test_class_sizes_are_checked_against_the_data_at_upload(api: Api) -> None:
    _, token = api.tenant()
    cases = {"below a true count": {"x": 3, "y": 4, "z": 4},
             "above N̂": {"x": 13, "y": 4, "z": 4},
             "a class missing": {"x": 5, "y": 5},
             "an unknown class": {**SIZES, "w": 1},
             "zero": {**SIZES, "x": 0}}
    for why, sizes in cases.items():
        r = _private(api, token, class_sizes=sizes)
        assert r.status_code == 422 and r.json()["code"] == "invalid_dataset", (why, r.text)
    r = _private(api, token, class_sizes={"x": 3, "y": 4, "z": 4})
    assert r.json()["classes"] == ["x"] and "at least the class's true count" in r.text
    r = api.upload(token, b.zip_bytes(b.image_folder({"a": 2})), {
        "name": "pub", "visibility": "public", "class_sizes": {"a": 2}})
    assert r.status_code == 422
    assert api.ledger.budgets == {}  # nothing registered for a refused upload

    r = _private(api, token, class_sizes=SIZES)
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["class_sizes"] == SIZES
    assert api.ledger.budgets[ds["dataset_id"]].class_sizes == SIZES
    view = api.client.get(f"/v1/datasets/{ds['dataset_id']}", headers=auth(token)).json()
    assert view["class_sizes"] == SIZES
    budget = api.client.get(f"/v1/datasets/{ds['dataset_id']}/budget",
                            headers=auth(token)).json()
    assert budget["class_sizes"] == SIZES


def test_a_per_label_finetune_without_class_sizes_is_refused(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token).json()["dataset_id"]
    model = api.model(token)
    for dry in (True, False):
        r = api.client.post("/v1/jobs" + ("?dry_run=true" if dry else ""),
                            json=_per_label_spec(dataset, model), headers=auth(token))
        assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
        assert "class_sizes" in r.json()["detail"]
    assert api.ledger.reservations == {} and api.sender.sent == []


def test_a_per_label_finetune_reserves_one_job_with_a_run_per_class(api: Api) -> None:
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    r = api.client.post("/v1/jobs", json=_per_label_spec(dataset, model, batch=5, epochs=2),
                        headers=auth(token))
    assert r.status_code == 201, r.text
    job = r.json()
    (entry,) = api.ledger.reservations.values()  # ONE reservation for the whole job
    request_parts = entry.reservation.plan.per_label
    # batch_c = min(5, N̂_c); steps_c = ceil(2 · N̂_c / batch_c)
    expected = {"x": (5, 2), "y": (4, 2), "z": (5, 3)}
    assert {c: (p.expected_batch_size, p.event.steps) for c, p in request_parts.items()} \
        == expected
    privacy = job["privacy"]
    assert privacy["reservation_id"] == entry.reservation.reservation_id
    assert privacy["noise_multiplier"] is None and privacy["sample_rate"] is None
    assert {c: (p["expected_batch_size"], p["steps"], p["class_size"])
            for c, p in privacy["per_label"].items()} == {
        c: (bs, st, SIZES[c]) for c, (bs, st) in expected.items()}
    assert privacy["per_label"]["z"]["sample_rate"] == 5 / 6
    assert job["progress"]["total"] == privacy["steps"] == 7
    claim = api.worker(f"{job['job_id']}/claim", {"attempt": 1, "worker_id": "w"}).json()
    assert claim["dataset"]["class_sizes"] == SIZES
    assert claim["reservation_id"] == privacy["reservation_id"]



def test_dry_run_shows_the_calibrated_per_class_plan(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    dataset = _private(api, token, class_sizes=SIZES).json()["dataset_id"]
    model = api.model(token)
    r = api.client.post("/v1/jobs?dry_run=true", headers=auth(token),
                        json=_per_label_spec(dataset, model, epsilon=2.0, batch=5, epochs=2))
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["admissible"] is True and plan["noise_multiplier"] is None
    sigmas = {}
    for name, part in plan["per_label"].items():
        batch = min(5, SIZES[name])
        assert part["sample_rate"] == batch / SIZES[name]
        assert part["steps"] == math.ceil(2 * SIZES[name] / batch)
        assert part["class_size"] == SIZES[name]
        assert 1.9 < part["job_epsilon"] <= 2.0  # each class's model alone: (2.0, δ)
        sigmas[name] = part["noise_multiplier"]
    assert sigmas["x"] == sigmas["y"]  # same shape (q = 1, 2 steps): same calibration
    assert sigmas["z"] != sigmas["x"]
    assert plan["job_epsilon"] == max(p["job_epsilon"] for p in plan["per_label"].values())
    assert plan["dataset_epsilon_spent_before"] == 0.0
    assert 0 < plan["dataset_epsilon_spent_after"] <= 10.0
    assert plan["dataset_tight_epsilon_after"] == pytest.approx(plan["job_epsilon"], rel=1e-6)
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["rdp_reserved"] == 0.0 and budget["class_sizes"] == SIZES
    r = api.client.post("/v1/jobs", headers=auth(token),
                        json=_per_label_spec(dataset, model, epsilon=2.0, batch=5, epochs=2))
    assert r.status_code == 201, r.text
    assert r.json()["privacy"]["per_label"].keys() == SIZES.keys()
    budget = api.client.get(f"/v1/datasets/{dataset}/budget", headers=auth(token)).json()
    assert budget["rdp_reserved"] > 0 and budget["partitions"]["*"] == 0.0
