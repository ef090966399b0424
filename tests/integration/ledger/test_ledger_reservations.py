"""Charging, refusals with the largest admissible target, leases, extension, fencing."""

from __future__ import annotations

import math

import pytest
from dpsynth_ledger.accounting import dp_sgd_epsilon
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.grants import public_key_of, verify_grant
from fastapi.testclient import TestClient
from opacus.accountants.analysis.rdp import compute_rdp

from .conftest import new_budget

N = 60_000


def _reserve(client: TestClient, job: str, *, target: float, batch: int = 600,
             steps: int = 400, dataset: str = "ds_r") -> dict:
    r = client.post("/v1/reservations", json={"job_id": job, "dataset_id": dataset,
                                              "target_epsilon": target,
                                              "expected_batch_size": batch, "steps": steps})
    assert r.status_code in (201, 409), r.text
    return r.json()


def _grant(client: TestClient, rid: str, attempt: int) -> dict:
    r = client.post(f"/v1/reservations/{rid}/read-grants",
                    json={"attempt": attempt, "worker_id": f"w{attempt}"})
    return {"status": r.status_code, **r.json()}


def _lease(client: TestClient, rid: str, attempt: int, start: int, steps: int) -> dict:
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": attempt, "start_step": start, "steps": steps})
    return {"status": r.status_code, **r.json()}


def test_charging_is_the_rdp_of_granted_steps(client: TestClient) -> None:
    budget = new_budget(client, "ds_r", epsilon_limit=8.0, delta=1e-6, partitions=["a", "b"])
    order = budget["admission_order"]
    res = _reserve(client, "job_1", target=2.0)
    rid, ev = res["reservation_id"], res["event"]
    assert res["plan"]["admissible"] is True and res["state"] == "open"
    assert res["job_epsilon"] <= 2.0
    assert _grant(client, rid, 1)["status"] == 201
    assert _lease(client, rid, 1, 0, 100)["status"] == 201
    lease = _lease(client, rid, 1, 100, 150)
    assert lease["status"] == 201 and lease["steps_granted_total"] == 250
    assert lease["job_epsilon_granted"] == pytest.approx(
        dp_sgd_epsilon(ev["noise_multiplier"], ev["sample_rate"], 250, 1e-6))
    view = client.get("/v1/budgets/ds_r").json()
    independent = float(compute_rdp(q=600 / N, noise_multiplier=ev["noise_multiplier"],
                                    steps=250, orders=[order])[0])
    for partition in ("*", "a", "b"):
        assert view["partitions"][partition] == pytest.approx(independent, rel=1e-9)
        assert view["partitions"][partition] >= independent * (1 - 1e-12)
    assert view["rdp_reserved"] == pytest.approx(independent * 150 / 250, rel=1e-9)
    assert [c["kind"] for c in view["history"]][-2:] == ["lease_granted", "lease_granted"]
    assert view["history"][-1]["dataset_tight_epsilon_after"] == pytest.approx(
        lease["job_epsilon_granted"])
    closed = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "cancelled"}).json()
    assert closed["state"] == "closed" and closed["steps_granted"] == 250
    after = client.get("/v1/budgets/ds_r", params={"history": False}).json()
    assert after["rdp_reserved"] == 0.0
    assert after["partitions"] == view["partitions"]  # committed never decreases
    again = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "failed"})
    assert again.status_code == 200 and again.json()["state"] == "closed"
    je = client.post("/v1/job-epsilon", json={"dataset_id": "ds_r",
                                              "reservation_ids": [rid]}).json()
    assert je["job_epsilon"] == pytest.approx(lease["job_epsilon_granted"])
    assert je["steps_granted"] == 250 and je["delta"] == 1e-6
    # a model produced by 180 of the 250 granted steps (the rest were replayed after a
    # crash) states the epsilon of its 180; the dataset stays charged for all 250
    used = client.post("/v1/job-epsilon", json={"dataset_id": "ds_r", "reservation_ids": [rid],
                                                "steps_used": {rid: 180}}).json()
    assert used["steps_used"] == 180 and used["steps_granted"] == 250
    assert used["job_epsilon"] == pytest.approx(
        dp_sgd_epsilon(ev["noise_multiplier"], ev["sample_rate"], 180, 1e-6))
    assert used["job_epsilon"] < je["job_epsilon"]
    over = client.post("/v1/job-epsilon", json={"dataset_id": "ds_r", "reservation_ids": [rid],
                                                "steps_used": {rid: 251}})
    assert over.status_code == 400 and "granted" in over.json()["detail"]
    assert closed["steps_planned"] == 400  # the admitted length, before any extension


def test_refusal_carries_numbers_and_an_admissible_target(client: TestClient) -> None:
    new_budget(client, "ds_r", epsilon_limit=4.0, delta=1e-6)
    first = _reserve(client, "job_a", target=1.5, steps=300)
    assert first["state"] == "open"
    dry = client.post("/v1/reservations", json={
        "job_id": "job_b", "dataset_id": "ds_r", "target_epsilon": 3.5,
        "expected_batch_size": 600, "steps": 300, "dry_run": True}).json()
    assert dry["admissible"] is False and "reservation_id" not in dry
    refused = _reserve(client, "job_b", target=3.5, steps=300)
    assert refused["code"] == "privacy_budget_exhausted" and refused["status"] == 409
    for key in ("epsilon_limit", "dataset_epsilon_spent", "dataset_epsilon_reserved",
                "target_epsilon", "job_epsilon", "admission_order"):
        assert key in refused, key
    assert refused["epsilon_limit"] == 4.0 and refused["target_epsilon"] == 3.5
    best = refused["max_admissible_target_epsilon"]
    assert best == pytest.approx(dry["max_admissible_target_epsilon"], rel=1e-6)
    assert 0 < best < 3.5
    retried = _reserve(client, "job_b", target=best, steps=300)
    assert retried["state"] == "open", retried
    kinds = [e["kind"] for e in client.get("/v1/entries", params={"dataset_id": "ds_r"}).json()]
    assert kinds == ["budget_created", "reservation_accepted", "reservation_refused",
                     "reservation_accepted"]
    # idempotent on job_id
    assert _reserve(client, "job_b", target=0.5, steps=10)["reservation_id"] == \
        retried["reservation_id"]
    view = client.get("/v1/budgets/ds_r").json()
    assert view["dataset_epsilon_spent"] + view["dataset_epsilon_reserved"] <= 4.0


def test_leases_extension_and_fencing(client: TestClient, settings: LedgerSettings) -> None:
    new_budget(client, "ds_r", epsilon_limit=6.0, delta=1e-6)
    res = _reserve(client, "job_l", target=2.0, steps=200)
    rid = res["reservation_id"]
    early = _lease(client, rid, 1, 0, 10)
    assert early["status"] == 403 and early["code"] == "read_grant_required"
    g1 = _grant(client, rid, 1)
    assert g1["status"] == 201
    assert _lease(client, rid, 1, 0, 150)["status"] == 201
    over = _lease(client, rid, 1, 150, 100)
    assert over["status"] == 409 and over["code"] == "reservation_exhausted"
    assert (over["steps_reserved"], over["steps_granted"], over["steps_remaining"]) == \
        (200, 150, 50)
    ext = client.post(f"/v1/reservations/{rid}/extend",
                      json={"attempt": 1, "additional_steps": 100})
    assert ext.status_code == 200 and ext.json()["steps_reserved"] == 300
    assert _lease(client, rid, 1, 150, 100)["status"] == 201
    too_large = client.post(f"/v1/reservations/{rid}/extend",  # beyond max_steps: unaccounted
                            json={"attempt": 1, "additional_steps": 10_000_000})
    assert too_large.status_code == 422 and too_large.json()["code"] == "plan_too_large"
    huge = client.post(f"/v1/reservations/{rid}/extend",
                       json={"attempt": 1, "additional_steps": 90_000})
    assert huge.status_code == 409 and huge.json()["code"] == "privacy_budget_exhausted"
    assert huge.json()["max_additional_steps"] >= 0
    # a newer attempt's read grant fences the old attempt
    g2 = _grant(client, rid, 2)
    assert g2["status"] == 201 and g2["attempt"] == 2
    stale = _lease(client, rid, 1, 250, 10)
    assert stale["status"] == 409 and stale["code"] == "stale_attempt"
    assert _grant(client, rid, 1)["code"] == "stale_attempt"
    stale_ext = client.post(f"/v1/reservations/{rid}/extend",
                            json={"attempt": 1, "additional_steps": 1})
    assert stale_ext.json()["code"] == "stale_attempt"
    lease = _lease(client, rid, 2, 250, 50)
    assert lease["status"] == 201 and lease["steps_granted_total"] == 300
    # the read grant verifies with the public key, names the attempt, and expires
    public = public_key_of(settings.grant_signing_key.get_secret_value())
    claims = verify_grant(lease["grant"]["token"], public)
    assert (claims.reservation_id, claims.attempt, claims.dataset_id) == (rid, 2, "ds_r")
    assert math.isclose(claims.expires_at, claims.expires_at)
    with pytest.raises(DpsynthError) as info:
        verify_grant(lease["grant"]["token"], public, now=claims.expires_at + 1)
    assert info.value.code == "invalid_grant"
    with pytest.raises(DpsynthError):
        verify_grant(lease["grant"]["token"], public_key_of(
            "A" * 43))  # another key
    ended = client.post(f"/v1/reservations/{rid}/leases/{lease['lease_id']}/end")
    assert ended.status_code == 200
    with pytest.raises(DpsynthError):
        verify_grant(ended.json()["grant"]["token"], public)  # ended: expired now
    view = client.get("/v1/budgets/ds_r", params={"history": False}).json()
    granted = client.get(f"/v1/reservations/{rid}").json()
    assert granted["steps_granted"] == 300  # ending early never refunds
    assert view["rdp_spent"] > 0
    assert client.get("/v1/chain/verify").json()["ok"] is True
