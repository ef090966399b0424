"""Class sizes released by a charged Gaussian histogram, on the real ledger (PostgreSQL).

The release is ONE Gaussian mechanism (L2 sensitivity 1 under add/remove) calibrated to a
target epsilon at the dataset's delta; it is admitted through the RDP filter and charged
α*/(2σ²) on EVERY partition ("*" and each label) at once. Every number is checked
independently: the charge by its closed form, σ's epsilon by the closed form of the analytic
Gaussian mechanism (Balle & Wang 2018) with scipy, the accumulators by the independent chain
replay (tests/e2e/ledger_replay.py, opacus).
"""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from scipy.optimize import brentq
from scipy.stats import norm

from tests.e2e.ledger_replay import conversion, replay_accumulators

LABELS = ["a", "b", "c"]
N = 600
DELTA = 1e-6


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε at δ of the Gaussian mechanism of sensitivity 1 and std σ, exactly (Balle & Wang
    2018, Thm. 8): δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ), solved for ε."""
    def gap(eps: float) -> float:
        return float(norm.cdf(1 / (2 * sigma) - eps * sigma)
                     - math.exp(eps) * norm.cdf(-1 / (2 * sigma) - eps * sigma)) - delta
    return float(brentq(gap, 1e-9, 200.0, xtol=1e-12))


def _budget(client: TestClient, dataset: str, *, limit: float = 8.0) -> dict:
    r = client.post("/v1/budgets", json={
        "dataset_id": dataset, "tenant_id": "ten_test", "epsilon_limit": limit,
        "delta": DELTA, "declared_size": N, "partitions": LABELS})
    assert r.status_code == 201, r.text
    return r.json()


def _release(client: TestClient, dataset: str, target: float, dry_run: bool = False):
    return client.post(f"/v1/budgets/{dataset}/histogram-releases",
                       json={"target_epsilon": target, "dry_run": dry_run})


def _entries(client: TestClient, dataset: str) -> list[dict]:
    return client.get("/v1/entries", params={"dataset_id": dataset}).json()


def test_a_release_charges_every_partition_its_gaussian_rdp_once(client: TestClient) -> None:
    order = _budget(client, "ds_h")["admission_order"]
    target = 0.5
    dry = _release(client, "ds_h", target, dry_run=True)
    assert dry.status_code == 201, dry.text
    dry = dry.json()
    assert dry["charged"] is False and dry["release_id"] is None and dry["admissible"]
    view = client.get("/v1/budgets/ds_h").json()
    assert set(view["partitions"].values()) == {0.0}  # the dry run charged nothing
    assert [e["kind"] for e in _entries(client, "ds_h")] == ["budget_created"]

    r = _release(client, "ds_h", target)
    assert r.status_code == 201, r.text
    rel = r.json()
    assert rel["charged"] is True and rel["release_id"].startswith("rel_")
    ev = rel["event"]
    assert ev == {**dry["event"]} and ev["kind"] == "gaussian" and ev["sensitivity"] == 1.0
    sigma = ev["sigma"]
    # σ gives the target by an independent accountant (analytic Gaussian, closed form)
    eps = analytic_gaussian_epsilon(sigma, DELTA)
    assert eps == pytest.approx(target, rel=0.01) and eps <= target
    assert rel["epsilon"] == pytest.approx(target, rel=0.01)
    # the charge on every partition is α*/(2σ²)
    closed = order / (2 * sigma**2)
    assert rel["rdp_charge"] == pytest.approx(closed, rel=1e-12)
    view = client.get("/v1/budgets/ds_h").json()
    assert set(view["partitions"]) == {"*", *LABELS}
    for amount in view["partitions"].values():
        assert amount == pytest.approx(closed, rel=1e-12) and amount >= closed * (1 - 1e-15)
    assert view["dataset_epsilon_spent"] == pytest.approx(conversion(closed, order, DELTA),
                                                          rel=1e-9)
    assert rel["dataset_epsilon_spent_after"] == pytest.approx(view["dataset_epsilon_spent"])
    assert rel["dataset_epsilon_spent_before"] == 0.0
    assert view["dataset_tight_epsilon"] == pytest.approx(target, rel=0.01)
    assert view["class_sizes"] is None
    last = view["history"][-1]
    assert last["kind"] == "histogram_released"
    assert last["rdp_delta"] == pytest.approx(closed, rel=1e-12)
    assert last["dataset_tight_epsilon_after"] == pytest.approx(target, rel=0.01)
    entries = _entries(client, "ds_h")
    assert entries[-1]["kind"] == "histogram_released"
    replay = replay_accumulators(entries)
    assert replay == pytest.approx(view["partitions"], rel=1e-12)

    # the released sizes go on the budget through a chained entry, once
    sizes = {"a": 310, "b": 118, "c": 41}
    bad = client.put("/v1/budgets/ds_h/class-sizes",
                     json={"class_sizes": sizes, "release_id": "rel_" + "0" * 32})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request", bad.text
    bad = client.put("/v1/budgets/ds_h/class-sizes",
                     json={"class_sizes": {**sizes, "a": N + 1}, "release_id": rel["release_id"]})
    assert bad.status_code == 400, bad.text
    ok = client.put("/v1/budgets/ds_h/class-sizes",
                    json={"class_sizes": sizes, "release_id": rel["release_id"]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["class_sizes"] == sizes
    last = _entries(client, "ds_h")[-1]
    assert last["kind"] == "class_sizes_set" and last["payload"]["source"] == "dp_histogram"
    again = client.put("/v1/budgets/ds_h/class-sizes",
                       json={"class_sizes": sizes, "release_id": rel["release_id"]})
    assert again.status_code == 409
    r = _release(client, "ds_h", target)
    assert r.status_code == 409 and r.json()["code"] == "conflict"  # sizes are set: no more

    # per-label jobs then use the released sizes: q_c = batch_c / N̂_c
    plan = client.post("/v1/plans", json={"dataset_id": "ds_h", "target_epsilon": 2.0,
                                          "per_label": {c: {"expected_batch_size": 40,
                                                            "steps": 3} for c in LABELS}})
    assert plan.status_code == 200, plan.text
    for c, part in plan.json()["per_label"].items():
        assert part["class_size"] == sizes[c]
        assert part["event"]["sample_rate"] == 40 / sizes[c]
    # the job's tight figure composes the release with the job's runs
    assert plan.json()["dataset_tight_epsilon_after"] > plan.json()["job_epsilon"]
    verify = client.get("/v1/chain/verify").json()
    assert verify["ok"], verify["problems"]


def test_a_refused_release_charges_nothing(client: TestClient) -> None:
    order = _budget(client, "ds_hr", limit=1.0)["admission_order"]
    r = _release(client, "ds_hr", 2.0)  # a Gaussian of epsilon 2 cannot fit a limit of 1
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["rdp_requested"] > body["rdp_budget"] and body["rdp_committed"] == 0.0
    best = body["max_admissible_target_epsilon"]
    assert 0 < best < 1.0
    view = client.get("/v1/budgets/ds_hr").json()
    assert set(view["partitions"].values()) == {0.0} and view["dataset_epsilon_spent"] == 0.0
    assert [e["kind"] for e in _entries(client, "ds_hr")] == ["budget_created",
                                                              "histogram_refused"]
    dry = _release(client, "ds_hr", 2.0, dry_run=True).json()
    assert dry["admissible"] is False and dry["charged"] is False
    # the largest admissible target is admitted and fits the budget at α*
    r = _release(client, "ds_hr", best)
    assert r.status_code == 201, r.text
    sigma = r.json()["event"]["sigma"]
    assert order / (2 * sigma**2) <= client.get("/v1/budgets/ds_hr").json()["rdp_budget"]
    assert client.get("/v1/chain/verify").json()["ok"]


def test_a_release_needs_labels_and_a_budget(client: TestClient) -> None:
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_nolabels", "tenant_id": "t", "epsilon_limit": 8.0, "delta": DELTA,
        "declared_size": N})
    assert r.status_code == 201
    r = _release(client, "ds_nolabels", 1.0)
    assert r.status_code == 400 and "labels" in r.json()["detail"]
    assert _release(client, "ds_missing", 1.0).status_code == 404
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_sized", "tenant_id": "t", "epsilon_limit": 8.0, "delta": DELTA,
        "declared_size": N, "partitions": LABELS,
        "class_sizes": {"a": 300, "b": 200, "c": 100}})
    assert r.status_code == 201
    r = _release(client, "ds_sized", 1.0, dry_run=True)
    assert r.status_code == 409 and r.json()["code"] == "conflict"


def test_under_replace_one_the_histogram_has_sensitivity_sqrt2(client: TestClient) -> None:
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_ro", "tenant_id": "t", "epsilon_limit": 8.0, "delta": DELTA,
        "declared_size": N, "partitions": LABELS, "neighbouring": "replace_one"})
    assert r.status_code == 201, r.text
    order = r.json()["admission_order"]
    rel = _release(client, "ds_ro", 1.0).json()
    ev = rel["event"]
    assert ev["sensitivity"] == pytest.approx(math.sqrt(2)) and ev["neighbouring"] == "replace_one"
    # a record replaced moves two counts by 1: ε of σ/Δ as a unit-sensitivity Gaussian
    assert analytic_gaussian_epsilon(ev["sigma"] / ev["sensitivity"], DELTA) == \
        pytest.approx(1.0, rel=0.01)
    assert rel["rdp_charge"] == pytest.approx(order * 2 / (2 * ev["sigma"] ** 2), rel=1e-12)
    assert client.get("/v1/chain/verify").json()["ok"]
