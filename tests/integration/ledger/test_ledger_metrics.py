"""The ledger's Prometheus metrics on the real ledger (PostgreSQL): admissions accepted and
refused by reason (the filter, an unsupported neighbouring relation, a chain behind its
anchor after a restore), leases granted and lapsed, budget figures read from the database at
scrape time (equal to the budget views), datasets by state, and the per-dataset cap.

Lapsing a lease and lowering a limit are done in the database, as the passing of the lease's
TTL and an operator's lowered limit would leave it (no clock is waited on).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dpsynth_ledger.app import create_app
from dpsynth_ledger.metrics import LedgerMetrics, counts_refusals
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.errors import BudgetExhausted, DpsynthError, ErrorCode, NotFound
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, make_url, text

from tests.unit.test_grafana_dashboard import dashboard_metric_names

from .conftest import AUTH, make_settings, new_budget

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
DASHBOARD = Path(__file__).resolve().parents[3] / "deploy/grafana/dashboards/dpsynth.json"


def scrape(client: TestClient) -> Samples:
    """GET /metrics, parsed with prometheus_client's parser."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def per_dataset(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["dataset_id"]: v for (n, labels), v in samples.items() if n == name}


def admissions(samples: Samples, kind: str, decision: str, reason: str) -> float:
    return value(samples, "dpsynth_ledger_admissions_total", kind=kind, decision=decision,
                 reason=reason)


def _reserve(client: TestClient, job: str, dataset: str, target: float,
             steps: int = 400, dry_run: bool = False) -> Any:
    return client.post("/v1/reservations", json={
        "job_id": job, "dataset_id": dataset, "target_epsilon": target,
        "expected_batch_size": 600, "steps": steps, "dry_run": dry_run})


def _lease(client: TestClient, rid: str, start: int, steps: int) -> dict[str, Any]:
    r = client.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": start, "steps": steps})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _running(client: TestClient, job: str, dataset: str, target: float) -> str:
    r = _reserve(client, job, dataset, target)
    assert r.status_code == 201, r.text
    rid: str = r.json()["reservation_id"]
    g = client.post(f"/v1/reservations/{rid}/read-grants", json={"attempt": 1,
                                                                  "worker_id": "w1"})
    assert g.status_code == 201, g.text
    return rid


@pytest.fixture()
def db(database_url: str) -> Iterator[Any]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def test_metrics_show_admissions_leases_lapses_and_the_budgets(database_url: str,
                                                               db: Any) -> None:
    settings = make_settings(database_url, metrics_max_datasets=2, lease_ttl_s=3600,
                             metrics_per_dataset=True)
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        empty = scrape(client)
        assert value(empty, "dpsynth_ledger_metrics_scrape_error") == 0
        assert admissions(empty, "reservation", "refused", "budget_exhausted") == 0
        for state in ("ok", "warning", "exhausted"):
            assert value(empty, "dpsynth_ledger_datasets", state=state) == 0

        for ds in ("ds_ok", "ds_low", "ds_idle"):
            new_budget(client, ds, epsilon_limit=8.0)
        r = client.post("/v1/budgets", json={  # warns from 5% of its limit on
            "dataset_id": "ds_warn", "tenant_id": "ten_test", "epsilon_limit": 8.0,
            "delta": 1e-6, "declared_size": 60_000, "partitions": [], "warning_fraction": 0.05})
        assert r.status_code == 201, r.text
        # ds_ok: two leases, one lapses (its holder stopped) and one is ended; an extension
        rid_ok = _running(client, "job_ok", "ds_ok", 1.0)
        lapsing = _lease(client, rid_ok, 0, 100)["lease_id"]
        ended = _lease(client, rid_ok, 100, 100)["lease_id"]
        assert client.post(f"/v1/reservations/{rid_ok}/leases/{ended}/end").status_code == 200
        ext = client.post(f"/v1/reservations/{rid_ok}/extend",
                          json={"attempt": 1, "additional_steps": 10})
        assert ext.status_code == 200, ext.text
        # ds_warn: one job runs to its end; a job beyond the limit is refused by the filter
        rid_w = _running(client, "job_w", "ds_warn", 2.0)
        _lease(client, rid_w, 0, 400)
        refused = _reserve(client, "job_w2", "ds_warn", 12.0)
        assert refused.status_code == 409 and refused.json()["code"] == \
            "privacy_budget_exhausted"
        dry = _reserve(client, "job_w3", "ds_warn", 12.0, dry_run=True)
        assert dry.status_code == 201 and dry.json()["admissible"] is False  # not counted
        # ds_low: charged, closed, then its limit lowered below what it has spent
        rid_l = _running(client, "job_l", "ds_low", 1.0)
        _lease(client, rid_l, 0, 100)
        assert client.post(f"/v1/reservations/{rid_l}/close",
                           json={"outcome": "cancelled"}).status_code == 200
        with db.begin() as conn:
            conn.execute(text("UPDATE ledger.leases SET expires_at = now() - interval '1 hour',"
                              " granted_at = now() - interval '2 hours' WHERE lease_id = :id"),
                         {"id": lapsing})
            conn.execute(text("UPDATE ledger.budgets SET epsilon_limit = 0.1 "
                              "WHERE dataset_id = 'ds_low'"))

        views = {ds: client.get(f"/v1/budgets/{ds}", params={"history": False}).json()
                 for ds in ("ds_ok", "ds_warn", "ds_low", "ds_idle")}
        got = scrape(client)

    # counters of this process
    assert admissions(got, "reservation", "accepted", "none") == 3
    assert admissions(got, "reservation", "refused", "budget_exhausted") == 1
    assert admissions(got, "extension", "accepted", "none") == 1
    for reason in ("unsupported_neighbouring", "behind_anchor", "other"):
        assert admissions(got, "reservation", "refused", reason) == 0
    assert value(got, "dpsynth_ledger_leases_granted_total") == 4
    assert value(got, "dpsynth_ledger_read_grants_total") == 3
    assert value(got, "dpsynth_ledger_histogram_releases_total") == 0
    # read from the database: one lapsed, one ended, one running, one whose reservation
    # closed (not active, and never a lapse)
    assert value(got, "dpsynth_ledger_leases_expired_total") == 1
    assert value(got, "dpsynth_ledger_leases_recorded_total") == 4
    assert value(got, "dpsynth_ledger_leases_active") == 1
    assert value(got, "dpsynth_ledger_reservations_open") == 2

    # states, from the published figures (warning at 80% of the limit by default)
    fraction = {ds: v["dataset_epsilon_spent"] / v["epsilon_limit"] for ds, v in views.items()}
    assert 0.05 <= fraction["ds_warn"] < 0.8 and views["ds_warn"]["warning_fraction"] == 0.05
    assert 0 < fraction["ds_ok"] < min(0.8, fraction["ds_warn"])
    assert views["ds_low"]["dataset_epsilon_remaining"] == 0.0 and fraction["ds_low"] > 1
    assert views["ds_ok"]["dataset_epsilon_remaining"] > 1e-5
    assert views["ds_warn"]["dataset_epsilon_remaining"] > 1e-5
    assert {s: value(got, "dpsynth_ledger_datasets", state=s)
            for s in ("ok", "warning", "exhausted")} == {"ok": 2, "warning": 1, "exhausted": 1}
    for bound in ("0.1", "0.5", "0.8", "0.9", "1.0", "+Inf"):
        expected = sum(f <= float(bound) for f in fraction.values())
        assert value(got, "dpsynth_ledger_datasets_spent_fraction_bucket", le=bound) == \
            expected, bound
    assert value(got, "dpsynth_ledger_datasets_spent_fraction_gsum") == \
        pytest.approx(sum(fraction.values()))

    # the cap: only the two datasets nearest their limits have per-dataset series
    assert value(got, "dpsynth_ledger_datasets_omitted") == 2
    for name in ("limit", "spent", "reserved", "remaining"):
        series = per_dataset(got, f"dpsynth_ledger_dataset_epsilon_{name}")
        assert set(series) == {"ds_low", "ds_warn"}, name
    assert per_dataset(got, "dpsynth_ledger_dataset_budget_warning") == \
        {"ds_low": 1.0, "ds_warn": 1.0}

    # a restarted ledger (a fresh app on the same database, default cap) reports every
    # dataset's figures from the database, equal to its budget view; counters start again
    restarted = make_settings(database_url, metrics_per_dataset=True)
    with TestClient(create_app(restarted), headers=AUTH) as client:
        again = scrape(client)
    assert value(again, "dpsynth_ledger_datasets_omitted") == 0
    for key, name in (("epsilon_limit", "limit"), ("dataset_epsilon_spent", "spent"),
                      ("dataset_epsilon_reserved", "reserved"),
                      ("dataset_epsilon_remaining", "remaining")):
        assert per_dataset(again, f"dpsynth_ledger_dataset_epsilon_{name}") == \
            {ds: v[key] for ds, v in views.items()}, name
    assert per_dataset(again, "dpsynth_ledger_dataset_warning_fraction") == \
        {"ds_ok": 0.8, "ds_warn": 0.05, "ds_low": 0.8, "ds_idle": 0.8}
    assert per_dataset(again, "dpsynth_ledger_dataset_budget_warning") == \
        {"ds_ok": 0.0, "ds_warn": 1.0, "ds_low": 1.0, "ds_idle": 0.0}
    assert value(again, "dpsynth_ledger_leases_expired_total") == 1
    assert admissions(again, "reservation", "accepted", "none") == 0

    # every ledger metric the Grafana dashboard queries is in a real scrape
    names = {n for n, _ in again}
    used = {n for n in dashboard_metric_names(json.loads(DASHBOARD.read_text()))
            if n.startswith("dpsynth_ledger_")}
    assert used and used <= names, sorted(used - names)


def test_a_histogram_release_is_an_admission_and_a_release(client: TestClient) -> None:
    new_budget(client, "ds_h", partitions=["a", "b"], declared_size=600)
    r = client.post("/v1/budgets/ds_h/histogram-releases", json={"target_epsilon": 0.5})
    assert r.status_code == 201, r.text
    too_much = client.post("/v1/budgets/ds_h/histogram-releases",
                           json={"target_epsilon": 20.0})
    assert too_much.status_code == 409 and too_much.json()["code"] == \
        "privacy_budget_exhausted"
    got = scrape(client)
    assert admissions(got, "histogram", "accepted", "none") == 1
    assert admissions(got, "histogram", "refused", "budget_exhausted") == 1
    assert admissions(got, "reservation", "refused", "budget_exhausted") == 0
    assert value(got, "dpsynth_ledger_histogram_releases_total") == 1


def test_refusals_are_counted_by_a_bounded_reason() -> None:
    metrics = LedgerMetrics()

    def use_case(err: DpsynthError | None, *, ctx: Any, request: Any) -> str:
        if err is not None:
            raise err
        return "admitted"

    counted = counts_refusals("reservation")(use_case)
    ctx, live, dry = SimpleNamespace(metrics=metrics), SimpleNamespace(dry_run=False), \
        SimpleNamespace(dry_run=True)
    raised = [BudgetExhausted("over"), DpsynthError(ErrorCode.UNSUPPORTED_NEIGHBOURING, "r1"),
              DpsynthError(ErrorCode.LEDGER_BEHIND_ANCHOR, "behind"),
              DpsynthError(ErrorCode.POLICY_VIOLATION, "cap"),
              DpsynthError(ErrorCode.DATASET_DELETED, "gone"),
              NotFound("budget", "ds_x"), DpsynthError(ErrorCode.INVALID_REQUEST, "bad")]
    for err in raised:
        with pytest.raises(DpsynthError):
            counted(err, ctx=ctx, request=live)
    with pytest.raises(DpsynthError):
        counted(BudgetExhausted("over"), ctx=ctx, request=dry)  # a dry run decides nothing
    assert counted(None, ctx=ctx, request=live) == "admitted"
    samples = {(s.name, s.labels.get("reason")): s.value
               for fam in metrics.registry.collect() for s in fam.samples
               if s.name == "dpsynth_ledger_admissions_total"
               and s.labels["kind"] == "reservation" and s.labels["decision"] == "refused"}
    assert {reason: v for (_, reason), v in samples.items()} == {
        "budget_exhausted": 1, "unsupported_neighbouring": 1, "behind_anchor": 1, "other": 2}
    with pytest.raises(ValueError):
        counts_refusals("free text")


def test_a_scrape_without_the_database_reports_the_error(database_url: str) -> None:
    unreachable = database_url.rsplit("/", 1)[0] + "/dpsynth_no_such_database"
    with TestClient(create_app(make_settings(unreachable)), headers=AUTH) as client:
        got = scrape(client)
    assert value(got, "dpsynth_ledger_metrics_scrape_error") == 1
    assert not any(n.startswith("dpsynth_ledger_dataset") for n, _ in got)
    assert admissions(got, "reservation", "accepted", "none") == 0


def test_a_replace_one_job_refused_by_an_add_remove_dataset_is_counted(
        client: TestClient) -> None:
    new_budget(client, "ds_ar")
    body = {"dataset_id": "ds_ar", "target_epsilon": 1.0, "expected_batch_size": 20,
            "steps": 10, "neighbouring": "replace_one"}
    r = client.post("/v1/reservations", json={**body, "job_id": "job_x"})
    assert r.status_code == 422 and r.json()["code"] == "unsupported_neighbouring", r.text
    dry = client.post("/v1/reservations", json={**body, "job_id": "job_y", "dry_run": True})
    assert dry.status_code == 422  # a dry run decides nothing: not counted
    got = scrape(client)
    assert admissions(got, "reservation", "refused", "unsupported_neighbouring") == 1
    assert admissions(got, "reservation", "refused", "budget_exhausted") == 0
    assert value(got, "dpsynth_ledger_anchor_state", state="current") == 1


def _backup(settings: LedgerSettings, name: str) -> LedgerSettings:
    """A copy of the ledger's database now (``CREATE DATABASE … TEMPLATE``), as settings of a
    ledger restored from it (same keys and anchor)."""
    url = make_url(settings.database.url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{url.database}"'))
    finally:
        admin.dispose()
    restored = url.set(database=name).render_as_string(hide_password=False)
    return settings.model_copy(update={"database": settings.database.model_copy(
        update={"url": restored})})


def test_admissions_refused_behind_the_anchor_are_counted(settings: LedgerSettings) -> None:
    with TestClient(create_app(settings), headers=AUTH) as client:
        new_budget(client, "ds_bk", partitions=["a", "b"])
    restored = _backup(settings, make_url(settings.database.url).database + "_bak")
    with TestClient(create_app(settings), headers=AUTH) as client:  # a job after the backup
        assert _reserve(client, "job_a", "ds_bk", 1.0).status_code == 201
    with TestClient(create_app(restored), headers=AUTH) as client:
        got = scrape(client)
        assert value(got, "dpsynth_ledger_anchor_state", state="behind") == 1
        assert value(got, "dpsynth_ledger_anchor_state", state="current") == 0
        r = _reserve(client, "job_b", "ds_bk", 1.0)
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        h = client.post("/v1/budgets/ds_bk/histogram-releases", json={"target_epsilon": 0.5})
        assert h.status_code == 503 and h.json()["code"] == "ledger_behind_anchor", h.text
        got = scrape(client)
        assert admissions(got, "reservation", "refused", "behind_anchor") == 1
        assert admissions(got, "histogram", "refused", "behind_anchor") == 1
        assert admissions(got, "reservation", "accepted", "none") == 0
        report = client.post("/v1/admin/reconcile", json={"api_jobs": []})
        assert report.status_code == 200, report.text
        after = scrape(client)
        assert value(after, "dpsynth_ledger_anchor_state", state="current") == 1
        assert value(after, "dpsynth_ledger_anchor_state", state="behind") == 0


def test_used_up_leases_of_a_worker_that_went_on_are_not_lapses(database_url: str,
                                                                db: Any) -> None:
    """A worker leaves each used-up lease unended and asks for the next one (or closes the
    reservation): only a lease that was still current when its TTL passed is a lapse."""
    settings = make_settings(database_url, lease_ttl_s=3600)
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        new_budget(client, "ds_chain", epsilon_limit=8.0)
        rid = _running(client, "job_chain", "ds_chain", 1.0)
        first = _lease(client, rid, 0, 50)["lease_id"]
        second = _lease(client, rid, 50, 50)["lease_id"]
        new_budget(client, "ds_done", epsilon_limit=8.0)
        rid_done = _running(client, "job_done", "ds_done", 1.0)
        last = _lease(client, rid_done, 0, 50)["lease_id"]
        assert client.post(f"/v1/reservations/{rid_done}/close",
                           json={"outcome": "succeeded"}).status_code == 200
        before = scrape(client)
        # then time passes: the first lease was superseded by the second before its TTL
        # passed, the last one's reservation closed before its TTL passed, and the second
        # was the current lease of a reservation still open when its TTL passed: its holder
        # was lost
        times = {first: ("2 hours", "1 hour"), second: ("90 minutes", "30 minutes"),
                 last: ("2 hours", "1 hour")}
        with db.begin() as conn:
            for lease, (granted, expires) in times.items():
                conn.execute(text(f"UPDATE ledger.leases SET granted_at = now() - interval "
                                  f"'{granted}', expires_at = now() - interval '{expires}' "
                                  "WHERE lease_id = :id"), {"id": lease})
            conn.execute(text("UPDATE ledger.reservations SET closed_at = now() - interval "
                              "'90 minutes' WHERE reservation_id = :r"), {"r": rid_done})
        after = scrape(client)
    assert value(before, "dpsynth_ledger_leases_expired_total") == 0
    assert value(before, "dpsynth_ledger_leases_active") == 1  # the second lease only
    assert value(after, "dpsynth_ledger_leases_expired_total") == 1
    assert value(after, "dpsynth_ledger_leases_active") == 0


METRICS_TOKEN = "ledger-metrics-token-0123456789abcdef"


def test_metrics_need_the_metrics_token_when_one_is_set(database_url: str) -> None:
    """With DPSYNTH_LEDGER_METRICS_TOKEN set, a scrape without it (or with a service token,
    which Prometheus must not hold) is a 401 problem+json; with it, the figures."""
    settings = make_settings(database_url, metrics_token=METRICS_TOKEN)
    upgrade(settings)
    with TestClient(create_app(settings)) as client:
        for headers in ({}, AUTH, {"Authorization": "Bearer not-the-metrics-token"},
                        {"Authorization": f"Basic {METRICS_TOKEN}"}):
            r = client.get("/metrics", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] == "unauthenticated"
            assert "dpsynth_ledger" not in r.text
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert ok.status_code == 200, ok.text
        assert "dpsynth_ledger_datasets" in ok.text


def test_a_weak_metrics_token_is_refused_at_start(database_url: str) -> None:
    with pytest.raises(ValueError, match="DPSYNTH_LEDGER_METRICS_TOKEN"):
        make_settings(database_url, metrics_token="short")


@pytest.mark.parametrize("enabled", [False, True])
def test_dataset_ids_are_in_the_metrics_only_when_an_operator_enables_them(
        database_url: str, enabled: bool) -> None:
    """By default the scrape names no dataset (every tenant's ids would be on it): only the
    aggregates; DPSYNTH_LEDGER_METRICS_PER_DATASET=true adds the per-dataset gauges."""
    settings = make_settings(database_url, metrics_per_dataset=enabled)
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        new_budget(client, "ds_tenant_a_private", epsilon_limit=8.0)
        r = client.get("/metrics")
        assert r.status_code == 200, r.text
        samples = scrape(client)
    assert value(samples, "dpsynth_ledger_datasets", state="ok") == 1
    assert ("dataset_id" in r.text) is enabled
    assert ("ds_tenant_a_private" in r.text) is enabled
    limits = per_dataset(samples, "dpsynth_ledger_dataset_epsilon_limit")
    assert limits == ({"ds_tenant_a_private": 8.0} if enabled else {})
    assert value(samples, "dpsynth_ledger_datasets_omitted") == (0 if enabled else 1)

