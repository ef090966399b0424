"""One neighbouring relation per dataset, and per-label jobs when the labels are not disjoint
in the privacy unit, on the real ledger (PostgreSQL) (issue 4, items 2 and 3).

* A replace-one dataset admits a DP-SGD job (analysed add/remove) through group privacy at
  distance 2 (Mironov 2017, Prop. 2): every step is charged 3·RDP_add/remove(2α*), checked
  against opacus' RDP (a second implementation); σ meets the target as the job's standalone
  replace-one epsilon.
* A job analysed under replace-one is refused on an add/remove dataset (422).
* On a dataset whose labels are not disjoint (a subject with images in two classes), a
  per-label job's classes are summed: every class's charge lands on every partition, and the
  chain's replay (``GET /v1/chain/verify``) agrees.
"""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from tests.e2e.ledger_replay import conversion, independent_rdp, replay_accumulators

from .conftest import new_budget

DELTA = 1e-6
N = 2_000
SIZES = {"a": 900, "b": 700, "c": 400}


def _run_all(client: TestClient, res: dict) -> None:
    """Read grant, lease every reserved step (per class for a per-label job), close."""
    rid = res["reservation_id"]
    r = client.post(f"/v1/reservations/{rid}/read-grants", json={"attempt": 1, "worker_id": "w"})
    assert r.status_code == 201, r.text
    parts = ({c: p["steps_reserved"] for c, p in res["per_label"].items()}
             if res.get("per_label") else {None: res["steps_reserved"]})
    for label, steps in parts.items():
        half = steps // 2
        for start, n in ((0, half), (half, steps - half)):
            if n:
                r = client.post(f"/v1/reservations/{rid}/leases", json={
                    "attempt": 1, "start_step": start, "steps": n, "partition": label})
                assert r.status_code == 201, r.text
    r = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "succeeded"})
    assert r.status_code == 200, r.text


def _verify_ok(client: TestClient) -> None:
    report = client.get("/v1/chain/verify").json()
    assert report["ok"], report["problems"]


def _entries(client: TestClient, dataset: str) -> list[dict]:
    r = client.get("/v1/entries", params={"dataset_id": dataset})
    assert r.status_code == 200, r.text
    return r.json()


def test_replace_one_dataset_admits_dp_sgd_through_group_privacy(client: TestClient) -> None:
    budget = new_budget(client, "ds_ro", epsilon_limit=8.0, delta=DELTA, declared_size=N)
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_ro2", "tenant_id": "ten_test", "epsilon_limit": 8.0, "delta": DELTA,
        "declared_size": N, "neighbouring": "replace_one"})
    assert r.status_code == 201, r.text
    ro = r.json()
    order = ro["admission_order"]
    assert order == budget["admission_order"] and ro["neighbouring"] == "replace_one"
    shape = {"target_epsilon": 2.0, "expected_batch_size": 40, "steps": 150}

    plan_ar = client.post("/v1/plans", json={"dataset_id": "ds_ro", **shape}).json()
    plan = client.post("/v1/plans", json={"dataset_id": "ds_ro2", **shape}).json()
    assert plan["composition"] == "single" and plan_ar["notes"] == []
    assert any("charged through group privacy at distance 2 (Mironov 2017, Prop. 2)" in n
               for n in plan["notes"])
    sigma, q = plan["event"]["noise_multiplier"], plan["event"]["sample_rate"]
    assert q == pytest.approx(40 / N)
    # the target is the standalone replace-one epsilon: more noise than on add/remove
    assert sigma > plan_ar["event"]["noise_multiplier"]
    assert plan["job_epsilon"] <= 2.0
    # the step charge: 3 × the add/remove RDP at 2α* (opacus, an independent implementation)
    per_step = 3 * independent_rdp(sigma, q, 1, 2 * order)
    assert plan["rdp_per_step"] == pytest.approx(per_step, rel=1e-6)
    assert plan["rdp_total"] == pytest.approx(150 * per_step, rel=1e-6)
    assert plan["rdp_per_step"] > independent_rdp(sigma, q, 1, order)

    r = client.post("/v1/reservations", json={"job_id": "job_ro", "dataset_id": "ds_ro2",
                                              **shape})
    assert r.status_code == 201, r.text
    res = r.json()
    _run_all(client, res)
    view = client.get("/v1/budgets/ds_ro2").json()
    assert view["partitions"]["*"] == pytest.approx(150 * per_step, rel=1e-6)
    assert view["partitions"]["*"] >= plan["rdp_total"]
    assert view["dataset_epsilon_spent"] == pytest.approx(
        conversion(150 * per_step, order, DELTA), rel=1e-6)
    # the tight replace-one figure of the job stays below the filter figure
    assert view["dataset_epsilon_spent"] >= plan["job_epsilon"]
    leases = [e for e in _entries(client, "ds_ro2") if e["kind"] == "lease_granted"]
    assert sum(v["rdp_delta"]["*"] for v in (e["payload"] for e in leases)) == \
        pytest.approx(150 * per_step, rel=1e-9)
    created = next(e for e in _entries(client, "ds_ro2") if e["kind"] == "budget_created")
    assert created["payload"]["neighbouring"] == "replace_one"
    # the tight figures are replace-one PLD figures too (labelled; never the admission rule)
    assert res["job_epsilon"] == plan["job_epsilon"]
    assert view["dataset_tight_epsilon"] == plan["job_epsilon"]
    _verify_ok(client)  # the replay recomputes every group charge
    independent = replay_accumulators(_entries(client, "ds_ro2"))
    assert independent["*"] == pytest.approx(view["partitions"]["*"], rel=1e-6)
    report = client.get("/v1/budgets/ds_ro2/recompute").json()
    assert report["differences"] == [], report["differences"]


def test_replace_one_job_never_enters_an_add_remove_dataset(client: TestClient) -> None:
    new_budget(client, "ds_ar", declared_size=N, delta=DELTA)
    body = {"dataset_id": "ds_ar", "target_epsilon": 1.0, "expected_batch_size": 20,
            "steps": 10, "neighbouring": "replace_one"}
    for path, extra in (("/v1/plans", {}), ("/v1/reservations", {"job_id": "job_x"}),
                        ("/v1/reservations", {"job_id": "job_y", "dry_run": True})):
        r = client.post(path, json={**body, **extra})
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["code"] == "unsupported_neighbouring"
        assert "not add/remove private at all" in problem["detail"]
        assert problem["dataset_neighbouring"] == "add_remove"
    assert [e["kind"] for e in _entries(client, "ds_ar")] == ["budget_created"]
    # the same job analysed add/remove is admitted
    r = client.post("/v1/reservations", json={**body, "job_id": "job_z",
                                              "neighbouring": "add_remove"})
    assert r.status_code == 201, r.text


def _labels_budget(client: TestClient, dataset: str, *, disjoint: bool) -> dict:
    r = client.post("/v1/budgets", json={
        "dataset_id": dataset, "tenant_id": "ten_test", "epsilon_limit": 10.0, "delta": DELTA,
        "declared_size": N, "partitions": sorted(SIZES), "class_sizes": SIZES,
        "privacy_unit": "subject", "partitions_disjoint": disjoint})
    assert r.status_code == 201, r.text
    return r.json()


def _per_label(batch: int = 50, epochs: float = 1.0) -> dict[str, dict[str, int]]:
    return {c: {"expected_batch_size": min(batch, n), "steps": math.ceil(epochs * n / batch)}
            for c, n in SIZES.items()}


def test_non_disjoint_per_label_job_charges_the_sum_to_every_partition(
        client: TestClient) -> None:
    budget = _labels_budget(client, "ds_subj", disjoint=False)
    _labels_budget(client, "ds_subj_disjoint", disjoint=True)
    order = budget["admission_order"]
    body = {"dataset_id": "ds_subj", "target_epsilon": 1.0, "per_label": _per_label()}

    dry = client.post("/v1/reservations", json={**body, "job_id": "job_dry", "dry_run": True})
    assert dry.status_code == 201, dry.text
    plan = dry.json()
    assert plan["composition"] == "sequential"
    assert any("summed across classes" in n for n in plan["notes"])
    assert any("q and N̂ count subjects" in n for n in plan["notes"])
    parallel = client.post("/v1/plans", json={**body, "dataset_id": "ds_subj_disjoint"}).json()
    assert parallel["composition"] == "parallel"
    # each class: q_c = b_c / N̂_c (subjects), its own σ for the target
    per_class = {c: independent_rdp(p["event"]["noise_multiplier"], p["event"]["sample_rate"],
                                    p["event"]["steps"], order)
                 for c, p in plan["per_label"].items()}
    total = sum(per_class.values())
    assert plan["rdp_total"] == pytest.approx(total, rel=1e-6)
    assert parallel["rdp_total"] == pytest.approx(max(per_class.values()), rel=1e-6)
    # the job's models together: the classes compose (at least the most expensive class)
    assert plan["job_epsilon"] > max(p["job_epsilon"] for p in plan["per_label"].values())
    assert plan["dataset_epsilon_spent_after"] == pytest.approx(
        conversion(total, order, DELTA), rel=1e-6)

    r = client.post("/v1/reservations", json={**body, "job_id": "job_subj"})
    assert r.status_code == 201, r.text
    res = r.json()
    # while open, every class's hold is on every partition
    held = client.get("/v1/budgets/ds_subj").json()
    assert held["rdp_reserved"] == pytest.approx(total, rel=1e-6)
    _run_all(client, res)
    view = client.get("/v1/budgets/ds_subj").json()
    assert set(view["partitions"]) == {"*", "a", "b", "c"}
    for p, committed in view["partitions"].items():
        assert committed == pytest.approx(total, rel=1e-6), p
        assert committed >= plan["rdp_total"] * (1 - 1e-12)
    assert view["rdp_reserved"] == 0.0
    leases = [e["payload"] for e in _entries(client, "ds_subj") if e["kind"] == "lease_granted"]
    assert leases and all(set(e["rdp_delta"]) == {"*", "a", "b", "c"} for e in leases)
    # the tight figure composes the classes too (a subject may be in all of them)
    assert view["dataset_tight_epsilon"] == pytest.approx(plan["job_epsilon"], rel=1e-9)
    _verify_ok(client)  # the replay routes every class charge to every partition too
    independent = replay_accumulators(_entries(client, "ds_subj"))
    for p, committed in view["partitions"].items():
        assert independent[p] == pytest.approx(committed, rel=1e-6), p
    assert client.get("/v1/budgets/ds_subj/recompute").json()["differences"] == []

    # the same job on the disjoint dataset charges each class its own partition only
    r = client.post("/v1/reservations", json={**body, "dataset_id": "ds_subj_disjoint",
                                              "job_id": "job_disj"})
    assert r.status_code == 201, r.text
    _run_all(client, r.json())
    disj = client.get("/v1/budgets/ds_subj_disjoint").json()["partitions"]
    assert disj["*"] == 0.0
    for c in SIZES:
        assert disj[c] == pytest.approx(per_class[c], rel=1e-6)
    _verify_ok(client)


def test_non_disjoint_dataset_refuses_the_class_size_histogram(client: TestClient) -> None:
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_hist", "tenant_id": "ten_test", "epsilon_limit": 4.0, "delta": DELTA,
        "declared_size": N, "partitions": sorted(SIZES), "privacy_unit": "subject",
        "partitions_disjoint": False})
    assert r.status_code == 201, r.text
    for dry_run in (True, False):
        r = client.post("/v1/budgets/ds_hist/histogram-releases",
                        json={"target_epsilon": 1.0, "dry_run": dry_run})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_request"
        assert "not disjoint" in r.json()["detail"]
    assert [e["kind"] for e in _entries(client, "ds_hist")] == ["budget_created"]
    created = _entries(client, "ds_hist")[0]["payload"]
    assert created["privacy_unit"] == "subject" and created["partitions_disjoint"] is False
