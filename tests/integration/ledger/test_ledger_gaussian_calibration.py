"""A tenant's smallest one-shot Gaussian release answers at once (issue 14, items 1 and 4).

A private upload with ``size_epsilon=0.001`` made the ledger plan a size release at ε = 1e-3:
its calibration (PLD bisection from σ = 1 at an interval of 1e-6) ran past 15 s, and past
140 s at δ = 0.9999999999999999 with ``epsilon_limit=5e-324``. The σ is now the analytic
Gaussian mechanism's (dpsynth_ledger.accounting.gaussian.analytic_gaussian_sigma) and the contract
refuses a δ above 0.5 or a limit below 1e-3 before any work. Real ledger, real PostgreSQL.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from .conftest import new_budget
from .test_ledger_class_histogram import analytic_gaussian_epsilon


@pytest.mark.parametrize("delta", [1e-6, 1e-10, 1e-2])
def test_a_size_release_plan_at_the_smallest_target_answers_within_two_seconds(
        client: TestClient, delta: float) -> None:
    started = time.perf_counter()
    r = client.post("/v1/size-release-plans", json={
        "epsilon_limit": 1.0, "delta": delta, "target_epsilon": 0.001})
    elapsed = time.perf_counter() - started
    assert r.status_code == 200, r.text
    assert elapsed < 2.0
    plan = r.json()
    sigma = plan["event"]["sigma"]
    assert plan["epsilon"] <= 0.001
    assert analytic_gaussian_epsilon(sigma, delta) <= 0.001
    assert analytic_gaussian_epsilon(sigma, delta) == pytest.approx(0.001, rel=0.01)


def test_a_class_size_release_at_the_smallest_target_answers_within_two_seconds(
        client: TestClient) -> None:
    new_budget(client, "ds_small_target", declared_size=600, partitions=["a", "b"])
    started = time.perf_counter()
    r = client.post("/v1/budgets/ds_small_target/histogram-releases",
                    json={"target_epsilon": 0.001, "dry_run": True})
    assert time.perf_counter() - started < 2.0
    assert r.status_code == 201, r.text
    assert r.json()["epsilon"] <= 0.001


@pytest.mark.parametrize("body", [
    {"epsilon_limit": 1.0, "delta": 0.9999999999999999},
    {"epsilon_limit": 5e-324, "delta": 1e-6},
    {"epsilon_limit": 5e-324, "delta": 0.9999999999999999},
    {"epsilon_limit": 1.0, "delta": 0.6},
    {"epsilon_limit": 1.0, "delta": 5e-324},
    {"epsilon_limit": 0.0009, "delta": 1e-6},
])
def test_the_contract_refuses_what_the_accountant_cannot_take(client: TestClient,
                                                              body: dict) -> None:
    started = time.perf_counter()
    plan = client.post("/v1/size-release-plans", json={**body, "target_epsilon": 0.001})
    budget = client.post("/v1/budgets", json={
        **body, "dataset_id": "ds_refused", "tenant_id": "ten_test", "declared_size": 1})
    assert time.perf_counter() - started < 2.0
    for r in (plan, budget):
        # the ledger answers every contract violation 400 invalid_request (problems.py)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "invalid_request"
    assert client.get("/v1/budgets/ds_refused").status_code == 404


def test_the_widest_valid_delta_is_still_taken(client: TestClient) -> None:
    r = client.post("/v1/size-release-plans", json={
        "epsilon_limit": 1.0, "delta": 0.5, "target_epsilon": 0.001})
    assert r.status_code == 200, r.text
    assert r.json()["epsilon"] <= 0.001
