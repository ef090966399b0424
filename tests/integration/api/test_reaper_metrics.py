"""The reaper's work is exported (issue 14, item 2): ``dpsynth_api_jobs_resent_total`` counts
the tasks of unclaimed queued jobs sent again, ``dpsynth_api_jobs_reaped_total{outcome}`` the
jobs moved after their worker was lost. Read from ``/metrics`` (with the metrics token), on a
real PostgreSQL; reaper passes are driven by hand, as in test_reaper_queued.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from dpsynth_api.jobs.reaper import Reaper, ReapReport
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.api.conftest import Api, auth

METRICS_TOKEN = "api-metrics-token-0123456789abcdef"
PERIOD_S = 1  # lease_ttl_s and queued_resend_s
OUTCOMES = ("interrupted", "cancelled", "requeued", "failed")


def _scrape(api: Api) -> dict[str, float]:
    r = api.client.get("/metrics", headers=auth(METRICS_TOKEN))
    assert r.status_code == 200, r.text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "dpsynth_api_jobs_resent_total":
                values["resent"] = sample.value
            elif sample.name == "dpsynth_api_jobs_reaped_total":
                values[sample.labels["outcome"]] = sample.value
    return values


def _reaper(api: Api) -> Reaper:
    reaper: Reaper = api.client.app.state.reaper  # type: ignore[attr-defined]
    return reaper


def _claim(api: Api, job_id: str, attempt: int) -> None:
    r = api.worker(f"{job_id}/claim", {"attempt": attempt, "worker_id": "w"})
    assert r.status_code == 200, r.text


def test_reaper_passes_are_counted_in_metrics(make_api: Any) -> None:
    api = make_api(metrics_token=METRICS_TOKEN, lease_ttl_s=PERIOD_S,
                   queued_resend_s=PERIOD_S, max_attempts=2)
    # exported from the start, at zero (a dashboard's rate() needs the series)
    assert _scrape(api) == {"resent": 0.0, **dict.fromkeys(OUTCOMES, 0.0)}
    _, token = api.tenant()
    private, model = api.private_dataset(token), api.model(token)
    unclaimed, lost, cancelled = (api.finetune(token, private, model).json()["job_id"]
                                  for _ in range(3))
    for job_id in (lost, cancelled):
        _claim(api, job_id, 1)
    assert api.client.post(f"/v1/jobs/{cancelled}/cancel",
                           headers=auth(token)).status_code == 200
    time.sleep(PERIOD_S + 0.2)

    first = _reaper(api).reap_once()
    assert first.resent == [(unclaimed, 1)] and first.requeued == [(lost, 2)]
    assert first.interrupted == [lost] and first.cancelled == [cancelled]
    assert _scrape(api) == {"resent": 1.0, "interrupted": 1.0, "cancelled": 1.0,
                            "requeued": 1.0, "failed": 0.0}

    _claim(api, lost, 2)  # and lost again: the second lost attempt fails the job
    time.sleep(PERIOD_S + 0.2)
    second = _reaper(api).reap_once()
    assert second.failed == [lost] and second.resent == [(unclaimed, 1)]
    assert _scrape(api) == {"resent": 2.0, "interrupted": 2.0, "cancelled": 1.0,
                            "requeued": 1.0, "failed": 1.0}
    assert _reaper(api).reap_once().counts() == {"resent": 0, **dict.fromkeys(OUTCOMES, 0)}
    assert _scrape(api)["resent"] == 2.0


class _BrokerDown:
    """A task sender whose broker refuses every message."""

    def send_run_job(self, job_id: str, attempt: int) -> None:
        raise ConnectionError("broker unreachable")

    def ping(self) -> bool:
        return False


def test_a_pass_cut_short_still_reports_what_it_did(make_api: Any) -> None:
    """A requeue whose send fails ends the pass with an error; the jobs it had already moved
    are still counted (the callback runs in a finally)."""
    api = make_api(lease_ttl_s=PERIOD_S)
    _, token = api.tenant()
    private, model = api.private_dataset(token), api.model(token)
    job_id = api.finetune(token, private, model).json()["job_id"]
    _claim(api, job_id, 1)
    time.sleep(PERIOD_S + 0.2)
    seen: list[ReapReport] = []
    healthy = _reaper(api)
    down = Reaper(healthy.sessions, healthy.ledger, _BrokerDown(), lease_ttl_s=PERIOD_S,
                  max_attempts=3, interval_s=1, on_pass=seen.append)
    with pytest.raises(ConnectionError):
        down.reap_once()
    assert len(seen) == 1 and seen[0].interrupted == [job_id]
