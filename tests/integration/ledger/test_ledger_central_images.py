"""The DP central-image release (DP-FETA warm-up) on the real ledger (PostgreSQL).

A finetune's worker asks ``POST /v1/reservations/{id}/central-images`` before it draws the
noise: the ledger computes the public bound B = 0.5·√(h·w·c) of the downsampled image,
calibrates the noise for the target at the dataset's δ and charges ONE mechanism once to every
TRAINING partition (docs/privacy.md, "Central images"; dpsynth_shared.central_images):

* one full-data query: a Gaussian of sensitivity Δ = B (add/remove) or 2·B (replace-one),
  RDP α·Δ²/(2σ²), checked here against that closed form written out;
* ``queries`` Poisson-subsampled queries: a DP-SGD event (z, q, queries), checked against
  ``dp_accounting``'s RDP accountant (on a replace-one dataset: group privacy at distance 2,
  3·RDP(2α), exactly as a DP-SGD job is charged there).

Every charge is checked by the chain's replay (``GET /v1/chain/verify``), and the model's
epsilon composes the release with the job's DP-SGD steps.
"""

from __future__ import annotations

from typing import Any

import dp_accounting
import pytest
from dp_accounting import pld as dp_pld
from dp_accounting.rdp import RdpAccountant
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from sqlalchemy import make_url

from tests.e2e.ledger_replay import conversion

from .test_ledger_anchor import _clone_database, _ledger
from .test_ledger_class_histogram import analytic_gaussian_epsilon
from .test_ledger_tampering import _tamper

DELTA = 1e-6
HOLDOUT = "*holdout"
BOUND = 7.0  # 28x28x1 downsampled by 2: 0.5·√(14·14·1)
SHAPE = {"image_size": 28, "channels": 1, "downsample": 2}


def _budget(client: TestClient, dataset: str, *, neighbouring: str = "add_remove",
            limit: float = 8.0, size: int = 1000, labels: list[str] | None = None) -> dict:
    r = client.post("/v1/budgets", json={
        "dataset_id": dataset, "tenant_id": "ten_test", "epsilon_limit": limit,
        "delta": DELTA, "declared_size": size, "partitions": labels or ["a", "b"],
        "neighbouring": neighbouring})
    assert r.status_code == 201, r.text
    return r.json()


def _reserve(client: TestClient, job_id: str, dataset: str, *, target: float = 1.0,
             batch: int = 100, steps: int = 20) -> dict:
    r = client.post("/v1/reservations", json={
        "job_id": job_id, "dataset_id": dataset, "target_epsilon": target,
        "expected_batch_size": batch, "steps": steps})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _train(client: TestClient, rid: str, steps: int) -> None:
    r = client.post(f"/v1/reservations/{rid}/read-grants", json={"attempt": 1, "worker_id": "w"})
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": 0, "steps": steps})
    assert r.status_code == 201, r.text


def _release(client: TestClient, rid: str, job_id: str, target: float, *,
             sample_rate: float | None = None, queries: int = 1, dry_run: bool = False,
             **shape: int) -> Any:
    return client.post(f"/v1/reservations/{rid}/central-images", json={
        "job_id": job_id, "attempt": 1, "target_epsilon": target, **(shape or SHAPE),
        "sample_rate": sample_rate, "queries": queries, "dry_run": dry_run})


def _entries(client: TestClient, dataset: str) -> list[dict[str, Any]]:
    r = client.get("/v1/entries", params={"dataset_id": dataset})
    assert r.status_code == 200, r.text
    return list(r.json())


def _partitions(client: TestClient, dataset: str) -> dict[str, float]:
    return dict(client.get(f"/v1/budgets/{dataset}", params={"history": False})
                .json()["partitions"])


def _audits_pass(client: TestClient, dataset: str) -> None:
    verify = client.get("/v1/chain/verify").json()
    assert verify["ok"], verify["problems"]
    checked = client.get(f"/v1/budgets/{dataset}/verify").json()
    assert checked["ok"], checked["problems"]
    recompute = client.get(f"/v1/budgets/{dataset}/recompute")
    assert recompute.status_code == 200, recompute.text
    assert recompute.json()["differences"] == [], recompute.json()["differences"]


def _within_budget_and_audited(client: TestClient, dataset: str) -> None:
    """Committed + reserved RDP within the budget, and every audit of the chain passes."""
    spent = client.get(f"/v1/budgets/{dataset}").json()
    assert spent["rdp_spent"] + spent["rdp_reserved"] <= spent["rdp_budget"]
    _audits_pass(client, dataset)


def gaussian_rdp(order: int, sigma: float, sensitivity: float) -> float:
    """RDP at ``order`` of the Gaussian mechanism (Mironov 2017, Prop. 7): α·Δ²/(2σ²)."""
    return order * sensitivity**2 / (2 * sigma**2)


def subsampled_rdp(z: float, q: float, steps: int, order: int) -> float:
    """RDP at ``order`` of ``steps`` Poisson-subsampled Gaussians, by dp_accounting's RDP
    accountant (an implementation independent of the ledger's mpmath sum)."""
    acc = RdpAccountant(orders=[order])
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps))
    return float(acc._rdp[0])


def _holdout(client: TestClient, dataset: str) -> None:
    """A DP evaluation, so that the dataset has a held-out partition with a charge."""
    r = client.post("/v1/evaluations", json={
        "dataset_id": dataset, "job_id": "job_eval", "reference_dataset_id": dataset,
        "requested_by": "key_owner"})
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/evaluations/{r.json()['evaluation_id']}/dp-releases", json={
        "job_id": "job_eval", "attempt": 1, "target_epsilon": 0.5,
        "metrics": ["tstr_accuracy/cnn"], "holdout_size": 100})
    assert r.status_code == 201, r.text


def test_one_query_is_one_gaussian_charged_once_to_every_training_partition(
        client: TestClient) -> None:
    order = _budget(client, "ds_ci")["admission_order"]
    _holdout(client, "ds_ci")
    res = _reserve(client, "job_ci", "ds_ci")
    _train(client, res["reservation_id"], 10)
    before = client.get("/v1/budgets/ds_ci").json()
    assert set(before["partitions"]) == {"*", "a", "b", HOLDOUT}

    dry = _release(client, res["reservation_id"], "job_ci", 1.0, dry_run=True)
    assert dry.status_code == 201, dry.text
    assert dry.json()["charged"] is False and dry.json()["release_id"] is None
    assert dry.json()["admissible"] is True
    assert _partitions(client, "ds_ci") == before["partitions"]  # a dry run charges nothing
    assert len(_entries(client, "ds_ci")) == len(before["history"])

    r = _release(client, res["reservation_id"], "job_ci", 1.0)
    assert r.status_code == 201, r.text
    rel = r.json()
    ev = rel["event"]
    assert rel["charged"] is True and rel["release_id"].startswith("rel_")
    assert rel["reservation_id"] == res["reservation_id"] and rel["job_id"] == "job_ci"
    assert rel["dataset_id"] == "ds_ci" and rel["admission_order"] == order
    assert rel["bound"] == BOUND and ev["kind"] == "gaussian"
    assert ev["sensitivity"] == BOUND and ev["neighbouring"] == "add_remove"
    assert rel["noise_std"] == ev["sigma"]
    # the charge: α·Δ²/(2σ²) of the recorded σ, Δ (closed form, written out)
    charge = gaussian_rdp(order, ev["sigma"], BOUND)
    assert rel["rdp_charge"] == pytest.approx(charge, rel=1e-12)
    assert rel["rdp_charge"] >= charge * (1 - 1e-15)  # rounded up, never down
    # the standalone epsilon meets the target (analytic Gaussian: an independent formula)
    assert rel["epsilon"] <= 1.0 + 1e-9 and rel["epsilon"] == pytest.approx(1.0, rel=0.01)
    exact = analytic_gaussian_epsilon(ev["sigma"] / ev["sensitivity"], DELTA)
    assert exact <= 1.0 + 1e-9 and exact == pytest.approx(1.0, rel=0.01)
    # the dry run showed exactly what was charged
    assert dry.json()["event"] == ev and dry.json()["rdp_charge"] == rel["rdp_charge"]

    view = client.get("/v1/budgets/ds_ci").json()
    assert rel["partitions"] == ["*", "a", "b"]
    for p in ("*", "a", "b"):  # every training partition: once, the full charge
        assert view["partitions"][p] == pytest.approx(before["partitions"][p] + charge,
                                                      rel=1e-12)
    assert view["partitions"][HOLDOUT] == before["partitions"][HOLDOUT]  # not read
    assert view["dataset_epsilon_spent"] == pytest.approx(
        conversion(max(view["partitions"].values()), order, DELTA), rel=1e-9)
    assert rel["dataset_epsilon_spent_after"] == view["dataset_epsilon_spent"]
    assert view["dataset_tight_epsilon"] > before["dataset_tight_epsilon"]
    assert view["history"][-1]["kind"] == "central_images_released"
    assert view["history"][-1]["rdp_delta"] == rel["rdp_charge"]

    last = _entries(client, "ds_ci")[-1]
    assert last["kind"] == "central_images_released"
    payload = last["payload"]
    assert payload["rdp_delta"] == {"*": rel["rdp_charge"], "a": rel["rdp_charge"],
                                    "b": rel["rdp_charge"]}
    assert payload["release_id"] == rel["release_id"] and payload["attempt"] == 1
    assert payload["bound"] == BOUND and payload["noise_std"] == ev["sigma"]
    assert (payload["image_size"], payload["channels"], payload["downsample"]) == (28, 1, 2)
    assert payload["sample_rate"] is None and payload["queries"] == 1
    assert payload["rdp_requested"] == rel["rdp_charge"] and payload["epsilon"] == rel["epsilon"]
    assert payload["accumulators_after"]["a"]["committed"] == view["partitions"]["a"]

    # each accepted call is a new charge (a retried attempt pays again)
    again = _release(client, res["reservation_id"], "job_ci", 1.0)
    assert again.status_code == 201 and again.json()["release_id"] != rel["release_id"]
    assert _partitions(client, "ds_ci")["*"] == pytest.approx(
        view["partitions"]["*"] + charge, rel=1e-12)
    _audits_pass(client, "ds_ci")


def test_subsampled_queries_are_a_dp_sgd_event(client: TestClient) -> None:
    order = _budget(client, "ds_cq")["admission_order"]
    res = _reserve(client, "job_cq", "ds_cq")
    r = _release(client, res["reservation_id"], "job_cq", 1.0, sample_rate=0.1, queries=5)
    assert r.status_code == 201, r.text
    rel = r.json()
    ev = rel["event"]
    assert ev["kind"] == "dp_sgd" and ev["sample_rate"] == 0.1 and ev["steps"] == 5
    z = ev["noise_multiplier"]
    assert rel["noise_std"] == pytest.approx(z * BOUND, rel=1e-15)
    # the charge against dp_accounting's RDP accountant at the budget's order
    independent = subsampled_rdp(z, 0.1, 5, order)
    assert rel["rdp_charge"] == pytest.approx(independent, rel=1e-9)
    # the standalone epsilon meets the target, and is close to it (calibration: 1e-3 in z)
    assert rel["epsilon"] <= 1.0 + 1e-9 and rel["epsilon"] == pytest.approx(1.0, rel=0.02)
    # a second accountant of the same event (dp_accounting's PLD, independently composed)
    acc = dp_pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z)), 5))
    assert float(acc.get_epsilon(DELTA)) == pytest.approx(1.0, rel=0.02)
    # the same calibration and charge as a DP-SGD job of the same shape (q = 100/1000)
    plan = client.post("/v1/plans", json={"dataset_id": "ds_cq", "target_epsilon": 1.0,
                                          "expected_batch_size": 100, "steps": 5}).json()
    assert plan["event"]["noise_multiplier"] == z and plan["rdp_total"] == rel["rdp_charge"]
    assert set(_entries(client, "ds_cq")[-1]["payload"]["rdp_delta"]) == {"*", "a", "b"}
    _audits_pass(client, "ds_cq")


def test_replace_one_doubles_the_gaussian_sensitivity(client: TestClient) -> None:
    order = _budget(client, "ds_ar")["admission_order"]
    assert _budget(client, "ds_ro", neighbouring="replace_one")["admission_order"] == order
    ar = _release(client, _reserve(client, "job_ar", "ds_ar")["reservation_id"], "job_ar",
                  1.0).json()
    r = _release(client, _reserve(client, "job_ro", "ds_ro")["reservation_id"], "job_ro", 1.0)
    assert r.status_code == 201, r.text
    ro = r.json()
    ev = ro["event"]
    assert ev["neighbouring"] == "replace_one" and ev["sensitivity"] == 2 * BOUND
    assert ro["bound"] == BOUND
    # the same target: twice the noise (the replaced unit moves the sums by up to 2·B)
    assert ro["noise_std"] == pytest.approx(2 * ar["noise_std"], rel=1e-12)
    charge = gaussian_rdp(order, ev["sigma"], 2 * BOUND)
    assert ro["rdp_charge"] == pytest.approx(charge, rel=1e-12)
    # at its noise, 4x the RDP the add/remove sensitivity would have been charged
    assert ro["rdp_charge"] == pytest.approx(4 * gaussian_rdp(order, ev["sigma"], BOUND),
                                             rel=1e-12)
    assert ro["rdp_charge"] == pytest.approx(ar["rdp_charge"], rel=1e-12)  # z meets the target
    assert ro["epsilon"] == pytest.approx(ar["epsilon"], rel=1e-12)
    assert set(_entries(client, "ds_ro")[-1]["payload"]["rdp_delta"]) == {"*", "a", "b"}
    _audits_pass(client, "ds_ro")


def test_replace_one_subsampled_queries_go_through_group_privacy(client: TestClient) -> None:
    order = _budget(client, "ds_roq", neighbouring="replace_one")["admission_order"]
    res = _reserve(client, "job_roq", "ds_roq")
    r = _release(client, res["reservation_id"], "job_roq", 1.0, sample_rate=0.1, queries=5)
    assert r.status_code == 201, r.text
    rel = r.json()
    z = rel["event"]["noise_multiplier"]
    assert rel["event"]["kind"] == "dp_sgd" and rel["noise_std"] == pytest.approx(z * BOUND)
    # Mironov 2017, Prop. 2 at distance 2: 3 × the add/remove RDP at 2α (dp_accounting)
    assert rel["rdp_charge"] == pytest.approx(3 * subsampled_rdp(z, 0.1, 5, 2 * order),
                                              rel=1e-9)
    assert rel["epsilon"] <= 1.0 + 1e-9 and rel["epsilon"] == pytest.approx(1.0, rel=0.02)
    # exactly as a DP-SGD job of the same shape is calibrated and charged on this dataset
    plan = client.post("/v1/plans", json={"dataset_id": "ds_roq", "target_epsilon": 1.0,
                                          "expected_batch_size": 100, "steps": 5}).json()
    assert plan["event"]["noise_multiplier"] == z and plan["rdp_total"] == rel["rdp_charge"]
    _audits_pass(client, "ds_roq")


def test_a_refused_release_charges_nothing(client: TestClient) -> None:
    _budget(client, "ds_cr", limit=1.0)
    res = _reserve(client, "job_cr", "ds_cr", target=0.3)
    before = _partitions(client, "ds_cr")
    kinds = [e["kind"] for e in _entries(client, "ds_cr")]
    dry = _release(client, res["reservation_id"], "job_cr", 3.0, dry_run=True)
    assert dry.status_code == 201 and dry.json()["admissible"] is False
    assert [e["kind"] for e in _entries(client, "ds_cr")] == kinds  # a plan records nothing

    r = _release(client, res["reservation_id"], "job_cr", 3.0)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "privacy_budget_exhausted"
    assert body["rdp_after"] > body["rdp_budget"] and body["rdp_committed"] == 0.0
    assert body["rdp_reserved"] > 0  # the job's own reservation holds its room
    assert body["field"] == "training.central_images.target_epsilon"
    best = body["max_admissible_target_epsilon"]
    assert best is not None and 0 < best < 3.0
    assert _partitions(client, "ds_cr") == before
    last = _entries(client, "ds_cr")[-1]
    assert last["kind"] == "central_images_refused" and "rdp_delta" not in last["payload"]
    assert last["payload"]["decision"] == "refused"
    # the largest admissible target is admitted
    r = _release(client, res["reservation_id"], "job_cr", best)
    assert r.status_code == 201, r.text
    _within_budget_and_audited(client, "ds_cr")


def test_only_the_jobs_open_reservation_releases(client: TestClient) -> None:
    _budget(client, "ds_cx")
    rid = _reserve(client, "job_cx", "ds_cx")["reservation_id"]
    r = _release(client, rid, "job_other", 1.0)
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    assert _release(client, "res_missing", "job_cx", 1.0).status_code == 404
    r = _release(client, rid, "job_cx", 1.0, image_size=28, channels=1, downsample=3)
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    r = _release(client, rid, "job_cx", 1.0, queries=3)  # several queries need a sample rate
    assert r.status_code == 400
    r = _release(client, rid, "job_cx", 1.0, sample_rate=1e-300)  # < one unit per query
    assert r.status_code == 400 and r.json()["declared_size"] == 1000
    r = client.post(f"/v1/reservations/{rid}/close", json={"outcome": "succeeded"})
    assert r.status_code == 200, r.text
    r = _release(client, rid, "job_cx", 1.0)
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    assert set(_partitions(client, "ds_cx").values()) == {0.0}
    assert "central_images_released" not in [e["kind"] for e in _entries(client, "ds_cx")]


def test_verify_detects_a_lowered_central_image_charge(client: TestClient,
                                                        settings: LedgerSettings) -> None:
    _budget(client, "ds_ct")
    rid = _reserve(client, "job_ct", "ds_ct")["reservation_id"]
    assert _release(client, rid, "job_ct", 1.0).status_code == 201
    assert _release(client, rid, "job_ct", 1.0, sample_rate=0.1, queries=3).status_code == 201
    _audits_pass(client, "ds_ct")
    released = [e for e in _entries(client, "ds_ct") if e["kind"] == "central_images_released"]
    assert [e["payload"]["event"]["kind"] for e in released] == ["gaussian", "dp_sgd"]
    for entry in released:
        seq, charged = entry["seq"], entry["payload"]["rdp_delta"]["a"]
        _tamper(settings, (
            "UPDATE ledger.entries SET payload = jsonb_set(payload, '{rdp_delta,a}', "
            "to_jsonb(CAST(:amount AS double precision))) WHERE seq = :seq",
            {"amount": charged / 10, "seq": seq}))
        problems = client.get("/v1/chain/verify").json()["problems"]
        assert f"entry {seq}: hash mismatch (content altered)" in problems, problems
        assert any(p.startswith(f"entry {seq}: charge ") for p in problems), problems


def test_the_models_epsilon_composes_its_central_images(client: TestClient) -> None:
    _budget(client, "ds_ce")
    _budget(client, "ds_ce2")
    res = _reserve(client, "job_ce", "ds_ce")
    rid = res["reservation_id"]
    _train(client, rid, 20)
    gauss = _release(client, rid, "job_ce", 0.5).json()
    sub = _release(client, rid, "job_ce", 0.5, sample_rate=0.1, queries=5).json()
    body = {"dataset_id": "ds_ce", "reservation_ids": [rid]}
    # every release charged under the model's reservation composes without being named
    auto = client.post("/v1/job-epsilon", json=body)
    assert auto.status_code == 200, auto.text
    named = client.post("/v1/job-epsilon", json={
        **body, "release_ids": [gauss["release_id"], sub["release_id"], gauss["release_id"]]})
    assert named.status_code == 200, named.text
    eps_auto = auto.json()["job_epsilon"]
    assert named.json()["job_epsilon"] == eps_auto  # each release counts once

    # independently: dp_accounting's PLD of the job's 20 steps and the releases, composed
    sigma, q = res["event"]["noise_multiplier"], res["event"]["sample_rate"]
    z = gauss["event"]["sigma"] / gauss["event"]["sensitivity"]
    zq = sub["event"]["noise_multiplier"]

    def pld(*parts: dp_accounting.DpEvent) -> float:
        acc = dp_pld.PLDAccountant(value_discretization_interval=1e-3)  # the ledger's
        acc.compose(dp_accounting.ComposedDpEvent(list(parts)))
        return float(acc.get_epsilon(DELTA))

    steps = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), 20)
    queries = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(zq)), 5)
    eps_steps = pld(steps)
    assert eps_auto == pytest.approx(pld(steps, dp_accounting.GaussianDpEvent(z), queries),
                                     rel=1e-9)
    assert eps_steps < eps_auto
    # and it is below the plain sum of the parts (composition, not addition)
    assert eps_auto < eps_steps + gauss["epsilon"] + sub["epsilon"]

    # a release charged under ANOTHER reservation of the dataset composes only when named
    rid3 = _reserve(client, "job_ce3", "ds_ce")["reservation_id"]
    extra = _release(client, rid3, "job_ce3", 0.5).json()
    plus = client.post("/v1/job-epsilon", json={**body, "release_ids": [extra["release_id"]]})
    assert plus.status_code == 200, plus.text
    z3 = extra["event"]["sigma"] / extra["event"]["sensitivity"]
    assert plus.json()["job_epsilon"] == pytest.approx(
        pld(steps, dp_accounting.GaussianDpEvent(z), queries, dp_accounting.GaussianDpEvent(z3)),
        rel=1e-5)  # two equal Gaussians: the ledger self-composes them (another grid)

    r = client.post("/v1/job-epsilon", json={**body, "release_ids": ["release_unknown"]})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    rid2 = _reserve(client, "job_ce2", "ds_ce2")["reservation_id"]
    other = _release(client, rid2, "job_ce2", 0.5).json()["release_id"]
    r = client.post("/v1/job-epsilon", json={**body, "release_ids": [other]})  # other dataset
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    _audits_pass(client, "ds_ce")


def test_a_lost_central_image_charge_is_restored_from_the_anchor(
        settings: LedgerSettings) -> None:
    with _ledger(settings) as c:
        _budget(c, "ds_cl")
        rid = _reserve(c, "job_cl", "ds_cl")["reservation_id"]
    backup_url = _clone_database(settings, f"{make_url(settings.database.url).database}_bak")
    with _ledger(settings) as c:  # after the backup: two releases, then the restore
        gauss = _release(c, rid, "job_cl", 1.0).json()
        sub = _release(c, rid, "job_cl", 1.0, sample_rate=0.1, queries=5).json()
        before = _partitions(c, "ds_cl")
        tight_before = c.get("/v1/budgets/ds_cl").json()["dataset_tight_epsilon"]
    restored = settings.model_copy(update={"database": settings.database.model_copy(
        update={"url": backup_url})})
    with _ledger(restored) as c:
        assert set(_partitions(c, "ds_cl").values()) == {0.0}  # what the backup lacks
        rep = c.post("/v1/admin/reconcile", json={"api_jobs": []})
        assert rep.status_code == 200, rep.text
        assert rep.json()["ok"] is True and rep.json()["entries_replayed"] == 2, rep.json()
        after = _partitions(c, "ds_cl")
        assert after == pytest.approx(before, rel=1e-12)
        assert after["*"] >= gauss["rdp_charge"] + sub["rdp_charge"]
        restored_kinds = [e["payload"]["restored_kind"] for e in _entries(c, "ds_cl")
                          if e["kind"] == "restored_charge"]
        assert restored_kinds == ["central_images_released"] * 2
        # the restored releases are part of the tight figure and of the chain's replay
        view = c.get("/v1/budgets/ds_cl").json()
        assert view["dataset_tight_epsilon"] == pytest.approx(tight_before, rel=1e-9)
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is True, verify["problems"]
        # the model's epsilon still finds the restored releases by their ids
        r = c.post("/v1/job-epsilon", json={"dataset_id": "ds_cl", "reservation_ids": [rid],
                                            "release_ids": [gauss["release_id"],
                                                            sub["release_id"]]})
        assert r.status_code == 200, r.text
        assert r.json()["job_epsilon"] > max(gauss["epsilon"], sub["epsilon"])
