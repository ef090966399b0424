"""The dataset size N̂ released as a charged Gaussian count, on the real ledger (issue 13, item 2).

Under add/remove the count N has sensitivity 1. A private upload that asks for a DP count gets
σ from ``POST /v1/size-release-plans`` (stateless: the budget does not exist yet), draws the
noise itself, and sends N̂ with the budget; the ledger charges the count to every partition in
the budget's creation, as its first DP event (a one-bin ``histogram_released`` entry), so
verify, the opacus replay and the tight figure see it like any Gaussian release.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.e2e.ledger_replay import replay_accumulators
from tests.integration.ledger.test_ledger_class_histogram import analytic_gaussian_epsilon

LABELS = ["a", "b"]
DELTA = 1e-6


def _plan(client: TestClient, target: float, *, limit: float = 8.0,
          neighbouring: str = "add_remove") -> dict:
    r = client.post("/v1/size-release-plans", json={
        "epsilon_limit": limit, "delta": DELTA, "target_epsilon": target,
        "neighbouring": neighbouring})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _create(client: TestClient, dataset: str, sigma: float, target: float, *,
            limit: float = 8.0, declared: int = 517):
    return client.post("/v1/budgets", json={
        "dataset_id": dataset, "tenant_id": "ten_test", "epsilon_limit": limit,
        "delta": DELTA, "declared_size": declared, "partitions": LABELS,
        "size_release": {"release_id": f"rel_{dataset}", "target_epsilon": target,
                         "sigma": sigma, "margin_z": 6.0, "failure_probability": 9.9e-10}})


def _entries(client: TestClient, dataset: str) -> list[dict]:
    return list(client.get("/v1/entries", params={"dataset_id": dataset}).json())


def test_the_count_is_the_budgets_first_charge_on_every_partition(client: TestClient) -> None:
    target = 0.1
    plan = _plan(client, target)
    sigma = plan["event"]["sigma"]
    assert plan["event"]["sensitivity"] == 1.0 and plan["admissible"]
    # σ gives the target by an independent accountant (analytic Gaussian, closed form)
    assert analytic_gaussian_epsilon(sigma, DELTA) == pytest.approx(target, rel=0.01)
    assert analytic_gaussian_epsilon(sigma, DELTA) <= target
    r = _create(client, "ds_n", sigma, target)
    assert r.status_code == 201, r.text
    view = r.json()
    order = view["admission_order"]
    assert order == plan["admission_order"] and view["declared_size"] == 517
    closed = order / (2 * sigma**2)
    assert set(view["partitions"]) == {"*", *LABELS}
    for amount in view["partitions"].values():  # "*" and every label, once each
        assert amount == pytest.approx(closed, rel=1e-12)
    assert view["dataset_epsilon_spent"] == pytest.approx(plan["dataset_epsilon_spent_after"])
    assert view["dataset_tight_epsilon"] == pytest.approx(target, rel=0.01)
    entries = _entries(client, "ds_n")
    assert [e["kind"] for e in entries] == ["budget_created", "histogram_released"]
    created, count = entries[0]["payload"], entries[1]["payload"]
    assert created["declared_size_source"] == "dp_count"
    assert count["statistic"] == "dataset_size" and count["release_id"] == "rel_ds_n"
    assert count["event"]["sigma"] == sigma and count["margin_z"] == 6.0
    assert count["declared_size"] == 517  # N̂ is public; N never reaches the ledger
    assert replay_accumulators(entries) == pytest.approx(view["partitions"], rel=1e-12)
    verify = client.get("/v1/chain/verify").json()
    assert verify["ok"], verify["problems"]
    # a class-size release cannot adopt the count's release
    bad = client.put("/v1/budgets/ds_n/class-sizes",
                     json={"class_sizes": {"a": 3, "b": 3}, "release_id": "rel_ds_n"})
    assert bad.status_code == 400, bad.text
    # a declared size is recorded as such, and charges nothing
    plain = client.post("/v1/budgets", json={
        "dataset_id": "ds_d", "tenant_id": "t", "epsilon_limit": 8.0, "delta": DELTA,
        "declared_size": 600, "partitions": LABELS})
    assert plain.status_code == 201 and set(plain.json()["partitions"].values()) == {0.0}
    assert _entries(client, "ds_d")[0]["payload"]["declared_size_source"] == "declared"


def test_a_count_that_does_not_fit_or_is_under_noised_creates_nothing(
        client: TestClient) -> None:
    big = _plan(client, 3.0, limit=1.0)
    assert big["admissible"] is False
    r = _create(client, "ds_big", big["event"]["sigma"], 3.0, limit=1.0)
    assert r.status_code == 409 and r.json()["code"] == "privacy_budget_exhausted", r.text
    sigma = _plan(client, 0.5)["event"]["sigma"]
    r = _create(client, "ds_low", sigma * 0.9, 0.5)  # less noise than the target needs
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    for dataset in ("ds_big", "ds_low"):
        assert client.get(f"/v1/budgets/{dataset}").status_code == 404
        assert _entries(client, dataset) == []
    # under replace-one the size is public: no DP count
    r = client.post("/v1/size-release-plans", json={
        "epsilon_limit": 8.0, "delta": DELTA, "target_epsilon": 0.5,
        "neighbouring": "replace_one"})
    assert r.status_code == 400 and "replace-one" in r.json()["detail"]
