"""DP evaluations charged to the held-out partition (issue 13, item 6), on the real ledger.

A DP evaluation releases m correct-classification counts on the dataset's HELD-OUT records
(sensitivity √m) with Gaussian noise. The ledger calibrates σ, admits it through the filter on
the held-out partition ``"*holdout"`` ALONE (parallel to the training partitions: the 1-stable
split makes the two parts disjoint), commits it at once, and verify/recompute/the independent
opacus replay all recompute it. Training charges never enter the held-out partition.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from sqlalchemy import make_url

from tests.e2e.ledger_replay import conversion, replay_accumulators

from .conftest import new_budget
from .test_ledger_anchor import _clone_database, _ledger, _run_job, _spent
from .test_ledger_class_histogram import analytic_gaussian_epsilon

HOLDOUT = "*holdout"
DELTA = 1e-6
METRICS = ["tstr_accuracy/cnn", "tstr_accuracy/logreg"]


def _authorise(client: TestClient, dataset_id: str, job_id: str) -> str:
    r = client.post("/v1/evaluations", json={
        "dataset_id": dataset_id, "job_id": job_id, "reference_dataset_id": dataset_id,
        "requested_by": "key_owner"})
    assert r.status_code == 201, r.text
    return str(r.json()["evaluation_id"])


def _release(client: TestClient, evaluation_id: str, job_id: str, target: float, *,
             metrics: list[str] | None = None, dry_run: bool = False) -> Any:
    return client.post(f"/v1/evaluations/{evaluation_id}/dp-releases", json={
        "job_id": job_id, "attempt": 1, "target_epsilon": target,
        "metrics": metrics or METRICS, "holdout_size": 250, "dry_run": dry_run})


def _entries(client: TestClient, dataset_id: str) -> list[dict[str, Any]]:
    r = client.get("/v1/entries", params={"dataset_id": dataset_id})
    assert r.status_code == 200, r.text
    return list(r.json())


def test_a_dp_evaluation_charges_the_holdout_partition_alone(client: TestClient) -> None:
    order = new_budget(client, "ds_dpe", delta=DELTA, partitions=["a", "b"])["admission_order"]
    _run_job(client, "job_train", dataset_id="ds_dpe", leases=1)
    before = client.get("/v1/budgets/ds_dpe").json()
    assert HOLDOUT not in before["partitions"]
    evaluation = _authorise(client, "ds_dpe", "job_eval")

    dry = _release(client, evaluation, "job_eval", 1.0, dry_run=True)
    assert dry.status_code == 201, dry.text
    assert dry.json()["charged"] is False and dry.json()["release_id"] is None
    assert client.get("/v1/budgets/ds_dpe").json()["partitions"] == before["partitions"]

    r = _release(client, evaluation, "job_eval", 1.0)
    assert r.status_code == 201, r.text
    rel = r.json()
    assert rel["charged"] is True and rel["partition"] == HOLDOUT
    ev = rel["event"]
    assert ev["sensitivity"] == pytest.approx(math.sqrt(2))  # two counts, each moved by ≤ 1
    # σ/Δ gives the target by an independent accountant (analytic Gaussian, closed form)
    eps = analytic_gaussian_epsilon(ev["sigma"] / ev["sensitivity"], DELTA)
    assert eps == pytest.approx(1.0, rel=0.01) and eps <= 1.0
    closed = order * ev["sensitivity"] ** 2 / (2 * ev["sigma"] ** 2)
    assert rel["rdp_charge"] == pytest.approx(closed, rel=1e-12)

    view = client.get("/v1/budgets/ds_dpe").json()
    # training partitions unchanged; the held-out partition carries the charge alone
    for p, amount in before["partitions"].items():
        assert view["partitions"][p] == amount
    assert view["partitions"][HOLDOUT] == pytest.approx(closed, rel=1e-12)
    # the filter figure is the max over disjoint partitions, never the sum
    training = max(before["partitions"].values())
    assert view["rdp_spent"] == max(training, view["partitions"][HOLDOUT])
    assert view["dataset_epsilon_spent"] == pytest.approx(
        conversion(max(training, closed), order, DELTA), rel=1e-9)
    assert view["partition_epsilon_spent"][HOLDOUT] == pytest.approx(
        conversion(closed, order, DELTA), rel=1e-9)
    assert view["dataset_tight_epsilon"] >= before["dataset_tight_epsilon"]
    assert view["history"][-1]["kind"] == "dp_evaluation_released"

    entries = _entries(client, "ds_dpe")
    last = entries[-1]
    assert last["kind"] == "dp_evaluation_released"
    assert set(last["payload"]["rdp_delta"]) == {HOLDOUT}
    assert last["payload"]["metrics"] == METRICS and last["payload"]["holdout_size"] == 250
    assert replay_accumulators(entries) == pytest.approx(view["partitions"], rel=1e-12)

    # a later training lease does not touch the held-out partition
    _run_job(client, "job_train2", dataset_id="ds_dpe", leases=1)
    after = client.get("/v1/budgets/ds_dpe").json()
    assert after["partitions"][HOLDOUT] == view["partitions"][HOLDOUT]
    assert after["partitions"]["*"] > view["partitions"]["*"]
    assert replay_accumulators(_entries(client, "ds_dpe")) == pytest.approx(
        after["partitions"], rel=1e-12)

    verify = client.get("/v1/chain/verify").json()
    assert verify["ok"], verify["problems"]
    recompute = client.get("/v1/budgets/ds_dpe/recompute")
    assert recompute.status_code == 200, recompute.text
    assert recompute.json()["differences"] == [], recompute.json()["differences"]
    checked = client.get("/v1/budgets/ds_dpe/verify").json()
    assert checked["ok"], checked["problems"]


def test_held_out_and_training_compose_in_parallel(client: TestClient) -> None:
    """A DP evaluation fits in the held-out partition's own room even when training has
    used most of the budget (and a training job still fits after a large evaluation)."""
    new_budget(client, "ds_par", epsilon_limit=3.0, delta=DELTA, partitions=["a"])
    _run_job(client, "job_t", dataset_id="ds_par", leases=2)
    spent = _spent(client, "ds_par")
    assert spent > 1.0
    evaluation = _authorise(client, "ds_par", "job_e")
    r = _release(client, evaluation, "job_e", 2.0, metrics=["tstr_accuracy/cnn"])
    assert r.status_code == 201, r.text  # sequentially the two would exceed the limit
    view = client.get("/v1/budgets/ds_par").json()
    assert view["dataset_epsilon_spent"] <= 3.0
    assert view["dataset_epsilon_spent"] == pytest.approx(
        max(spent, view["partition_epsilon_spent"][HOLDOUT]))


def test_a_refused_dp_evaluation_charges_nothing(client: TestClient) -> None:
    new_budget(client, "ds_ref", epsilon_limit=1.0, delta=DELTA, partitions=["a"])
    evaluation = _authorise(client, "ds_ref", "job_e")
    r = _release(client, evaluation, "job_e", 5.0)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["max_admissible_target_epsilon"] is not None
    assert body["max_admissible_target_epsilon"] < 5.0
    view = client.get("/v1/budgets/ds_ref").json()
    assert set(view["partitions"].values()) == {0.0}
    assert _entries(client, "ds_ref")[-1]["kind"] == "dp_evaluation_refused"
    ok = _release(client, evaluation, "job_e", body["max_admissible_target_epsilon"])
    assert ok.status_code == 201, ok.text
    verify = client.get("/v1/chain/verify").json()
    assert verify["ok"], verify["problems"]


def test_a_release_needs_the_jobs_authorisation(client: TestClient) -> None:
    new_budget(client, "ds_auth", delta=DELTA, partitions=["a"])
    evaluation = _authorise(client, "ds_auth", "job_e")
    r = _release(client, evaluation, "job_other", 1.0)
    assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
    r = _release(client, "evl_" + "0" * 32, "job_e", 1.0)
    assert r.status_code == 404, r.text
    r = client.post("/v1/budgets", json={
        "dataset_id": "ds_bad", "tenant_id": "ten_test", "epsilon_limit": 8.0,
        "delta": DELTA, "declared_size": 1000, "partitions": ["a", HOLDOUT]})
    assert r.status_code == 400, r.text  # the held-out partition's name is reserved


def test_verify_flags_a_dp_evaluation_charged_to_training() -> None:
    """Tampering check: a DP evaluation entry whose charge names "*" instead of the held-out
    partition is named by the replay (even with a consistent hash, via the replay rules)."""
    from dpsynth_ledger.chain_replay import Replay

    replay = Replay({"admission_order": 4, "partitions": ["*", "a"]})
    problems: list[str] = []
    event = {"kind": "gaussian", "sigma": 2.0, "sensitivity": 1.0,
             "neighbouring": "add_remove"}
    replay.apply("dp_evaluation_released", {"event": event, "metrics": ["m"],
                                            "rdp_delta": {"*": 4 / (2 * 4.0)}}, problems, 7)
    assert any("held-out partition alone" in p for p in problems), problems
    problems.clear()
    replay.apply("dp_evaluation_released", {"event": event, "metrics": ["m", "n"],
                                            "rdp_delta": {HOLDOUT: 0.5}}, problems, 8)
    assert any("sensitivity" in p for p in problems), problems


def test_a_lost_dp_evaluation_is_recharged_by_reconciliation(settings: LedgerSettings) -> None:
    """A restore to a backup taken before the release: reconciliation re-applies the anchored
    charge to the held-out partition (creating it), and verify accepts the result."""
    with _ledger(settings) as c:
        new_budget(c, "ds_rec", delta=DELTA, partitions=["a"])
        evaluation = _authorise(c, "ds_rec", "job_e")
    backup_url = _clone_database(settings, f"{make_url(settings.database.url).database}_bak")
    with _ledger(settings) as c:
        r = _release(c, evaluation, "job_e", 1.0)
        assert r.status_code == 201, r.text
        charged = c.get("/v1/budgets/ds_rec").json()["partitions"][HOLDOUT]
    restored = settings.model_copy(update={"database": settings.database.model_copy(
        update={"url": backup_url})})
    with _ledger(restored) as c:
        assert HOLDOUT not in c.get("/v1/budgets/ds_rec").json()["partitions"]
        report = c.post("/v1/admin/reconcile", json={"api_jobs": []})
        assert report.status_code == 200, report.text
        assert report.json()["ok"] is True, report.json()
        view = c.get("/v1/budgets/ds_rec").json()
        assert view["partitions"][HOLDOUT] == charged
        assert view["partitions"]["*"] == 0.0 and view["partitions"]["a"] == 0.0
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"], verify["problems"]
