"""The ledger's job refusals tell three cases apart (issue 15, item 3), under one stable code:
a job asking for more than is admissible (with a target that is then admitted), a budget
held by running jobs, and an exhausted budget."""

from __future__ import annotations

from typing import Any

from dpsynth_ledger.accounting import rdp_to_epsilon
from fastapi.testclient import TestClient

from .conftest import new_budget


def _reserve(client: TestClient, job: str, target: float) -> dict[str, Any]:
    r = client.post("/v1/reservations", json={"job_id": job, "dataset_id": "ds_w",
                                              "target_epsilon": target,
                                              "expected_batch_size": 600, "steps": 300})
    assert r.status_code in (201, 409), r.text
    body: dict[str, Any] = r.json()
    return body


def test_refusals_say_which_case_and_what_to_change(client: TestClient) -> None:
    new_budget(client, "ds_w", epsilon_limit=4.0)
    over = _reserve(client, "job_0", 20.0)
    assert over["code"] == "privacy_budget_exhausted"
    assert over["refusal"] == "exceeds_admissible"
    assert over["title"] == "Request exceeds the admissible privacy budget"
    suggested = over["suggested_target_epsilon"]
    assert 0 < suggested <= over["max_admissible_target_epsilon"]
    assert over["detail"].startswith(f"this job would need ε 20; at most {suggested:g} is "
                                     "admissible on this dataset now (lower target_epsilon "
                                     f"to ≤ {suggested:g})")
    held = _reserve(client, "job_a", suggested)  # the advice, followed, is admitted
    assert held["state"] == "open"
    view = client.get("/v1/budgets/ds_w").json()
    # a lower limit below what job_a holds, above what is spent (nothing yet): its RDP
    # budget at the dataset's order is half of what job_a reserved
    lower = rdp_to_epsilon(view["rdp_reserved"] / 2, view["admission_order"], view["delta"])
    r = client.post("/v1/budgets/ds_w/limit", json={"epsilon_limit": lower})
    assert r.status_code == 200, r.text
    waiting = _reserve(client, "job_b", 0.5)
    assert waiting["refusal"] == "reserved", waiting
    assert waiting["title"] == "Privacy budget held by running jobs"
    assert "exhausted" not in waiting["detail"] and waiting.get("suggested_target_epsilon") is None
    rid = held["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w1"}).status_code == 201
    assert client.post(f"/v1/reservations/{rid}/leases", json={
        "attempt": 1, "start_step": 0, "steps": 300}).status_code == 201
    assert client.post(f"/v1/reservations/{rid}/close",
                       json={"outcome": "succeeded"}).status_code == 200
    spent = _reserve(client, "job_c", 0.5)
    assert spent["refusal"] == "exhausted" and spent["title"] == "Privacy budget exhausted"
    assert spent["detail"].startswith("this dataset's privacy budget is exhausted")
    assert spent["code"] == "privacy_budget_exhausted"
