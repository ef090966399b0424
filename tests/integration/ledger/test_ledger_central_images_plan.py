"""A finetune's plan and admission compose its central-image release with DP-SGD (real ledger,
PostgreSQL).

A finetune with ``training.central_images`` makes two ledger events: the release, charged when
the job starts, and the DP-SGD steps its reservation holds. Its reservation request carries the
release's public terms (``central_images``), so that:

* the plan (a dry run) shows the dataset's spent figure, the tight figure and ``admissible``
  for BOTH: the filter figure after the job is the conversion of the two RDP charges summed
  (closed form below), not the DP-SGD part's alone;
* the admission refuses a job whose DP-SGD part fits but whose release would not fit beside it
  (the refusal is recorded, nothing is reserved), instead of admitting it to fail at the start;
* the release the worker then asks for is exactly the one the plan composed.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.e2e.ledger_replay import conversion

from .test_ledger_central_images import (
    BOUND,
    DELTA,
    SHAPE,
    _audits_pass,
    _budget,
    _entries,
    _partitions,
    _release,
    _within_budget_and_audited,
    gaussian_rdp,
)

TERMS = {"target_epsilon": 1.0, **SHAPE}


def _request(job_id: str, dataset: str, *, target: float = 1.0, dry_run: bool = False,
             central: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"job_id": job_id, "dataset_id": dataset, "target_epsilon": target,
                            "expected_batch_size": 100, "steps": 20, "dry_run": dry_run}
    if central is not None:
        body["central_images"] = central
    return body


def _plan(client: TestClient, dataset: str, **kw: Any) -> dict[str, Any]:
    r = client.post("/v1/reservations", json=_request("job_plan", dataset, dry_run=True, **kw))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_the_plan_composes_the_release_with_dp_sgd(client: TestClient) -> None:
    order = _budget(client, "ds_pc")["admission_order"]
    alone = _plan(client, "ds_pc")
    plan = _plan(client, "ds_pc", central=TERMS)
    release = plan["central_images"]
    assert alone["central_images"] is None and release is not None
    ev = release["event"]
    assert ev["kind"] == "gaussian" and ev["sensitivity"] == BOUND and release["bound"] == BOUND
    charge = gaussian_rdp(order, ev["sigma"], BOUND)  # α·Δ²/(2σ²), written out
    assert release["rdp_charge"] == pytest.approx(charge, rel=1e-12)
    assert release["partitions"] == ["*", "a", "b"]
    assert release["epsilon"] <= 1.0 + 1e-9
    # the DP-SGD part is unchanged; the figures after the job compose both charges
    assert plan["job_epsilon"] == alone["job_epsilon"] and plan["event"] == alone["event"]
    assert plan["rdp_total"] == alone["rdp_total"]
    assert alone["dataset_epsilon_spent_after"] == pytest.approx(
        conversion(alone["rdp_total"], order, DELTA), rel=1e-9)
    assert plan["dataset_epsilon_spent_after"] == pytest.approx(
        conversion(alone["rdp_total"] + charge, order, DELTA), rel=1e-9)
    assert plan["dataset_epsilon_spent_after"] > alone["dataset_epsilon_spent_after"]
    assert plan["dataset_tight_epsilon_after"] > alone["dataset_tight_epsilon_after"]
    assert plan["max_admissible_target_epsilon"] < alone["max_admissible_target_epsilon"]
    assert any("central images" in note for note in plan["notes"])
    assert _entries(client, "ds_pc")[-1]["kind"] == "budget_created"  # a plan records nothing

    # admitted; the worker's release is the one the plan composed, and once it is charged
    # and every step leased the dataset has spent the plan's figure
    r = client.post("/v1/reservations", json=_request("job_pc", "ds_pc", central=TERMS))
    assert r.status_code == 201, r.text
    res = r.json()
    accepted = _entries(client, "ds_pc")[-1]
    assert accepted["kind"] == "reservation_accepted"
    assert accepted["payload"]["central_images"]["rdp_charge"] == release["rdp_charge"]
    assert accepted["payload"]["reservation_rdp_outstanding"] == pytest.approx(
        alone["rdp_total"], rel=1e-12)  # the reservation holds the DP-SGD part only
    charged = _release(client, res["reservation_id"], "job_pc", 1.0)
    assert charged.status_code == 201, charged.text
    assert charged.json()["event"] == ev and charged.json()["rdp_charge"] == release["rdp_charge"]
    rid = res["reservation_id"]
    r = client.post(f"/v1/reservations/{rid}/read-grants", json={"attempt": 1, "worker_id": "w"})
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": 0, "steps": 20})
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "succeeded"})
    assert r.status_code == 200, r.text
    view = client.get("/v1/budgets/ds_pc").json()
    assert view["dataset_epsilon_spent"] == pytest.approx(
        plan["dataset_epsilon_spent_after"], rel=1e-9)
    _audits_pass(client, "ds_pc")


def test_a_job_whose_release_would_not_fit_is_refused_at_admission(
        client: TestClient) -> None:
    """ε limit 2: the DP-SGD part at ε 1.5 fits alone (the largest is 1.62), not with a
    release at ε 1.5 beside it (then the largest DP-SGD target is 1.08)."""
    _budget(client, "ds_pr", limit=2.0)
    central = {**TERMS, "target_epsilon": 1.5}
    alone = _plan(client, "ds_pr", target=1.5)
    plan = _plan(client, "ds_pr", target=1.5, central=central)
    assert alone["admissible"] is True and plan["admissible"] is False
    best = plan["max_admissible_target_epsilon"]  # the largest DP-SGD target beside it
    assert best is not None and best < 1.5 < alone["max_admissible_target_epsilon"]
    before = _partitions(client, "ds_pr")

    r = client.post("/v1/reservations", json=_request("job_pr", "ds_pr", target=1.5,
                                                      central=central))
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["rdp_after"] > body["rdp_budget"]
    assert body["max_admissible_target_epsilon"] == pytest.approx(best, rel=1e-6)
    last = _entries(client, "ds_pr")[-1]
    assert last["kind"] == "reservation_refused"
    assert last["payload"]["central_images"]["epsilon"] == plan["central_images"]["epsilon"]
    assert _partitions(client, "ds_pr") == before
    assert client.get("/v1/budgets/ds_pr").json()["rdp_reserved"] == 0.0

    # the largest target the refusal named is admitted beside the release, and both fit
    r = client.post("/v1/reservations", json=_request("job_pr2", "ds_pr", target=best,
                                                      central=central))
    assert r.status_code == 201, r.text
    charged = _release(client, r.json()["reservation_id"], "job_pr2", 1.5)
    assert charged.status_code == 201, charged.text
    _within_budget_and_audited(client, "ds_pr")


def test_central_images_are_refused_on_a_per_label_plan(client: TestClient) -> None:
    _budget(client, "ds_pl")
    r = client.post("/v1/reservations", json={
        "job_id": "job_pl", "dataset_id": "ds_pl", "target_epsilon": 1.0, "dry_run": True,
        "per_label": {"a": {"expected_batch_size": 10, "steps": 5}}, "central_images": TERMS})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert "per-label" in r.json()["detail"]
