"""Per-label jobs on the real ledger (PostgreSQL): one admission, one run per class.

A per-label job's class c adds its own RDP at the filter's order to partition c only
(parallel composition over the declared labels); a later whole-dataset job adds to every
partition; the dataset's figure is the max over partitions. Every number is checked against
an independent computation (opacus' RDP analysis, and its PRV accountant for the classes'
standalone epsilons) and the chain is replayed independently (tests/e2e/ledger_replay.py).
"""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from opacus.accountants import PRVAccountant

from tests.e2e.ledger_replay import conversion, independent_rdp, replay_accumulators

from .conftest import new_budget

SIZES = {"a": 300, "b": 120, "c": 40}
N = 600
DELTA = 1e-6


def _budget(client: TestClient, dataset: str, *, limit: float = 8.0,
            sizes: dict[str, int] | None = SIZES) -> dict:
    r = client.post("/v1/budgets", json={
        "dataset_id": dataset, "tenant_id": "ten_test", "epsilon_limit": limit,
        "delta": DELTA, "declared_size": N, "partitions": sorted(SIZES),
        "class_sizes": sizes})
    assert r.status_code == 201, r.text
    return r.json()


def _per_label(batch: int = 64, epochs: float = 2.0,
               classes: dict[str, int] | None = None) -> dict[str, dict[str, int]]:
    """The shapes the api sends: batch_c = min(batch, N̂_c), steps_c = ceil(epochs·N̂_c/b_c)."""
    out = {}
    for name, size in (classes or SIZES).items():
        b = min(batch, size)
        out[name] = {"expected_batch_size": b, "steps": max(1, math.ceil(epochs * size / b))}
    return out


def _reserve(client: TestClient, job: str, dataset: str, *, target: float,
             per_label: dict | None = None, **whole: int) -> dict:
    body = {"job_id": job, "dataset_id": dataset, "target_epsilon": target}
    body.update({"per_label": per_label} if per_label is not None else whole)
    r = client.post("/v1/reservations", json=body)
    assert r.status_code in (201, 409), r.text
    return {"status": r.status_code, **r.json()}


def _run_all(client: TestClient, res: dict, *, chunks: int = 2) -> None:
    """Read grant, then lease every reserved step (per class for a per-label job), close."""
    rid = res["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w"}).status_code == 201
    parts = ({c: p["steps_reserved"] for c, p in res["per_label"].items()}
             if res.get("per_label") else {None: res["steps_reserved"]})
    for label, steps in parts.items():
        start = 0
        for k in range(chunks):
            n = steps // chunks + (steps % chunks if k == chunks - 1 else 0)
            if n == 0:
                continue
            r = client.post(f"/v1/reservations/{rid}/leases", json={
                "attempt": 1, "start_step": start, "steps": n, "partition": label})
            assert r.status_code == 201, r.text
            assert r.json()["partition"] == label
            start += n
            assert r.json()["steps_granted_total"] == start
    r = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "succeeded"})
    assert r.status_code == 200, r.text


def test_a_per_label_plan_needs_declared_class_sizes(client: TestClient) -> None:
    new_budget(client, "ds_nosizes", declared_size=N, partitions=sorted(SIZES))
    r = client.post("/v1/plans", json={"dataset_id": "ds_nosizes", "target_epsilon": 2.0,
                                       "per_label": _per_label()})
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text
    assert "class_sizes" in r.json()["detail"]
    r = client.post("/v1/reservations", json={"job_id": "job_ns", "dataset_id": "ds_nosizes",
                                              "target_epsilon": 2.0, "per_label": _per_label()})
    assert r.status_code == 422
    assert client.get("/v1/budgets/ds_nosizes").json()["rdp_reserved"] == 0.0


def test_class_sizes_are_checked_recorded_and_shown(client: TestClient) -> None:
    for bad in ({"a": 300, "b": 120}, {**SIZES, "d": 3}, {**SIZES, "c": 0},
                {**SIZES, "a": N + 1}):
        r = client.post("/v1/budgets", json={
            "dataset_id": "ds_bad", "tenant_id": "t", "epsilon_limit": 8.0, "delta": DELTA,
            "declared_size": N, "partitions": sorted(SIZES), "class_sizes": bad})
        assert r.status_code in (400, 422), (bad, r.text)
    view = _budget(client, "ds_sizes")
    assert view["class_sizes"] == SIZES
    created = client.get("/v1/entries", params={"dataset_id": "ds_sizes"}).json()[0]
    assert created["kind"] == "budget_created" and created["payload"]["class_sizes"] == SIZES
    r = client.post("/v1/plans", json={"dataset_id": "ds_sizes", "target_epsilon": 2.0,
                                       "per_label": {"zz": {"expected_batch_size": 1,
                                                            "steps": 1}}})
    assert r.status_code in (400, 422) and "zz" in r.text
    r = client.post("/v1/plans", json={"dataset_id": "ds_sizes", "target_epsilon": 2.0,
                                       "per_label": {"c": {"expected_batch_size": 41,
                                                           "steps": 1}}})
    assert r.status_code in (400, 422) and "class 'c'" in r.json()["detail"]


def test_per_label_then_whole_dataset_compose_per_partition(client: TestClient) -> None:
    budget = _budget(client, "ds_pl")
    order = budget["admission_order"]
    target, shapes = 3.0, _per_label(batch=64, epochs=2.0)
    plan = client.post("/v1/plans", json={"dataset_id": "ds_pl", "target_epsilon": target,
                                          "per_label": shapes}).json()
    assert plan["expected_batch_size"] is None and plan["event"]["kind"] == "parallel"
    assert set(plan["per_label"]) == set(SIZES)
    for name, part in plan["per_label"].items():
        ev = part["event"]
        assert part["class_size"] == SIZES[name]
        assert ev["sample_rate"] == shapes[name]["expected_batch_size"] / SIZES[name]
        assert ev["steps"] == shapes[name]["steps"]
        assert part["job_epsilon"] <= target
        # Independent accountant (opacus PRV): each class's model alone is ~(target, δ).
        prv = PRVAccountant()
        prv.history = [(ev["noise_multiplier"], ev["sample_rate"], ev["steps"])]
        assert prv.get_epsilon(delta=DELTA) == pytest.approx(target, rel=0.03)
    # class c (40 records) trains with batch min(64, 40) = 40: q_c = 1
    assert plan["per_label"]["c"]["event"]["sample_rate"] == 1.0
    assert plan["job_epsilon"] == max(p["job_epsilon"] for p in plan["per_label"].values())
    assert plan["admissible"] is True

    res = _reserve(client, "job_pl", "ds_pl", target=target, per_label=shapes)
    assert res["status"] == 201 and res["per_label"] is not None
    assert res["plan"]["per_label"] == plan["per_label"]
    again = _reserve(client, "job_pl", "ds_pl", target=target, per_label=shapes)
    assert again["reservation_id"] == res["reservation_id"]  # idempotent on job_id
    held = client.get("/v1/budgets/ds_pl", params={"history": False}).json()
    assert held["partitions"]["*"] == 0.0 and held["rdp_reserved"] > 0
    _run_all(client, res)

    after_pl = client.get("/v1/budgets/ds_pl").json()
    parts = {c: p["event"] for c, p in res["per_label"].items()}
    class_rdp = {c: independent_rdp(e["noise_multiplier"], e["sample_rate"], e["steps"], order)
                 for c, e in parts.items()}
    assert after_pl["partitions"]["*"] == 0.0  # a per-label job never touches "*"
    for c in SIZES:
        assert after_pl["partitions"][c] == pytest.approx(class_rdp[c], rel=1e-9)
    assert after_pl["rdp_reserved"] == 0.0

    whole = _reserve(client, "job_whole", "ds_pl", target=1.0, expected_batch_size=60,
                     steps=20)
    assert whole["status"] == 201, whole
    _run_all(client, whole)
    ev = whole["event"]
    whole_rdp = independent_rdp(ev["noise_multiplier"], ev["sample_rate"], ev["steps"], order)
    view = client.get("/v1/budgets/ds_pl").json()
    assert view["partitions"]["*"] == pytest.approx(whole_rdp, rel=1e-9)
    expected = {c: class_rdp[c] + whole_rdp for c in SIZES}
    for c in SIZES:
        assert view["partitions"][c] == pytest.approx(expected[c], rel=1e-9)
        assert view["partitions"][c] >= expected[c] * (1 - 1e-12)  # rounded up, never down
    worst = max(expected.values())
    assert view["rdp_spent"] == pytest.approx(worst, rel=1e-9)
    assert view["dataset_epsilon_spent"] == pytest.approx(conversion(worst, order, DELTA),
                                                          rel=1e-9)
    # The filter figure is NOT the sum over classes: that would be sequential composition.
    assert view["dataset_epsilon_spent"] < conversion(
        sum(class_rdp.values()) + whole_rdp, order, DELTA)

    # The tight (PLD) figure composes per class too: max_c PRV(class c's run + whole job).
    tight = []
    for c, e in parts.items():
        prv = PRVAccountant()
        prv.history = [(e["noise_multiplier"], e["sample_rate"], e["steps"]),
                       (ev["noise_multiplier"], ev["sample_rate"], ev["steps"])]
        tight.append(prv.get_epsilon(delta=DELTA))
    assert view["dataset_tight_epsilon"] == pytest.approx(max(tight), rel=0.03)
    assert view["history"][-1]["dataset_tight_epsilon_after"] == pytest.approx(
        view["dataset_tight_epsilon"], rel=1e-9)

    # Independent replay of the chain's entries reproduces every partition.
    entries = client.get("/v1/entries", params={"dataset_id": "ds_pl"}).json()
    replayed = replay_accumulators(entries)
    assert replayed == pytest.approx(view["partitions"], rel=1e-12)
    assert client.get("/v1/chain/verify").json()["ok"] is True

    je = client.post("/v1/job-epsilon", json={"dataset_id": "ds_pl", "reservation_ids": [
        res["reservation_id"]]}).json()
    assert set(je["per_label"]) == set(SIZES)
    assert je["job_epsilon"] == pytest.approx(max(je["per_label"].values()))
    assert je["job_epsilon"] <= target + 1e-9
    # A model finetuned from the whole-dataset job's model composes with it, per class.
    both = client.post("/v1/job-epsilon", json={"dataset_id": "ds_pl", "reservation_ids": [
        whole["reservation_id"], res["reservation_id"]]}).json()
    for c in SIZES:
        assert both["per_label"][c] > je["per_label"][c]


def test_an_admission_overflowing_one_class_is_refused_entirely(client: TestClient) -> None:
    _budget(client, "ds_full", limit=4.0)
    shapes = _per_label(batch=64, epochs=2.0)
    only_a = {"a": shapes["a"]}
    # Most of class a's budget goes first (a per-label job may name a subset of classes).
    first = _reserve(client, "job_a", "ds_full", target=3.2, per_label=only_a)
    assert first["status"] == 201, first
    before = client.get("/v1/budgets/ds_full", params={"history": False}).json()
    refused = _reserve(client, "job_all", "ds_full", target=2.0, per_label=shapes)
    assert refused["status"] == 409 and refused["code"] == "privacy_budget_exhausted"
    assert refused["partitions_over_budget"] == ["a"]
    assert set(refused["rdp_requested_by_partition"]) == set(SIZES)
    best = refused["max_admissible_target_epsilon"]
    assert best is not None and best < 2.0
    after = client.get("/v1/budgets/ds_full", params={"history": False}).json()
    assert after["rdp_reserved"] == before["rdp_reserved"]  # nothing held for b or c either
    kinds = [e["kind"] for e in client.get("/v1/entries",
                                           params={"dataset_id": "ds_full"}).json()]
    assert kinds[-1] == "reservation_refused"
    # The advertised largest admissible target is admitted.
    ok = _reserve(client, "job_best", "ds_full", target=best, per_label=shapes)
    assert ok["status"] == 201, ok
    assert client.get("/v1/chain/verify").json()["ok"] is True


def test_per_label_leases_and_extensions_are_per_class(client: TestClient) -> None:
    _budget(client, "ds_ls")
    shapes = _per_label(batch=64, epochs=1.0)
    res = _reserve(client, "job_ls", "ds_ls", target=2.0, per_label=shapes)
    rid = res["reservation_id"]
    client.post(f"/v1/reservations/{rid}/read-grants", json={"attempt": 1, "worker_id": "w"})
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": 0, "steps": 1})
    assert r.status_code in (400, 422) and "partition" in r.text  # the class is required
    steps_b = shapes["b"]["steps"]
    r = client.post(f"/v1/reservations/{rid}/leases", json={
        "attempt": 1, "start_step": 0, "steps": steps_b + 1, "partition": "b"})
    assert r.status_code == 409 and r.json()["code"] == "reservation_exhausted"
    assert r.json()["partition"] == "b"
    before = client.get("/v1/budgets/ds_ls", params={"history": False}).json()["partitions"]
    r = client.post(f"/v1/reservations/{rid}/leases", json={
        "attempt": 1, "start_step": 0, "steps": steps_b, "partition": "b"})
    assert r.status_code == 201
    lease_b = r.json()
    after = client.get("/v1/budgets/ds_ls", params={"history": False}).json()["partitions"]
    assert {p for p in after if after[p] != before[p]} == {"b"}
    ext = client.post(f"/v1/reservations/{rid}/extend",
                      json={"attempt": 1, "additional_steps": 2, "partition": "b"})
    assert ext.status_code == 200, ext.text
    assert ext.json()["per_label"]["b"]["steps_reserved"] == steps_b + 2
    assert ext.json()["per_label"]["b"]["steps_planned"] == steps_b
    assert ext.json()["per_label"]["a"]["steps_reserved"] == shapes["a"]["steps"]
    r = client.post(f"/v1/reservations/{rid}/leases", json={
        "attempt": 1, "start_step": steps_b, "steps": 2, "partition": "b"})
    assert r.status_code == 201 and r.json()["steps_granted_total"] == steps_b + 2
    # The job's epsilon so far is the max over classes (only b has run).
    ev_b = ext.json()["per_label"]["b"]["event"]
    prv = PRVAccountant()
    prv.history = [(ev_b["noise_multiplier"], ev_b["sample_rate"], steps_b + 2)]
    assert r.json()["job_epsilon_granted"] == pytest.approx(prv.get_epsilon(delta=DELTA),
                                                           rel=0.03)
    assert r.json()["job_epsilon_granted"] > lease_b["job_epsilon_granted"]
    closed = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "cancelled"}).json()
    assert closed["state"] == "closed"
    assert closed["steps_granted"] == steps_b + 2
    view = client.get("/v1/budgets/ds_ls", params={"history": False}).json()
    assert view["rdp_reserved"] == 0.0  # every class's hold is released with the job
    assert view["partitions"]["a"] == 0.0 and view["partitions"]["c"] == 0.0
    assert client.get("/v1/chain/verify").json()["ok"] is True
