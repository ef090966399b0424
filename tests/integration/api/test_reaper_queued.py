"""The reaper re-sends queued jobs no worker claimed (issue 14, item 2): once per
``queued_resend_s``, never for a claimed job, once across replicas, again after a failed send;
and a duplicate message is harmless because exactly one claim of an attempt wins."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dpsynth_api.jobs.reaper import Reaper

from tests.integration.api.conftest import Api, auth

RESEND_S = 1


def _queued_job(api: Api) -> tuple[str, str]:
    _, token = api.tenant()
    job_id = api.finetune(token, api.private_dataset(token), api.model(token)).json()["job_id"]
    return job_id, token


def _reaper(api: Api) -> Reaper:
    reaper: Reaper = api.client.app.state.reaper  # type: ignore[attr-defined]
    return reaper


def test_an_unclaimed_queued_job_is_resent_once_per_period(make_api: Any) -> None:
    api = make_api(queued_resend_s=RESEND_S)
    job_id, token = _queued_job(api)
    assert api.sender.sent == [(job_id, 1)]
    assert _reaper(api).reap_once().resent == []  # sent just now: left alone
    time.sleep(RESEND_S + 0.2)
    assert _reaper(api).reap_once().resent == [(job_id, 1)]  # same attempt
    assert _reaper(api).reap_once().resent == []  # not again within the period
    time.sleep(RESEND_S + 0.2)
    assert _reaper(api).reap_once().resent == [(job_id, 1)]
    assert api.sender.sent == [(job_id, 1)] * 3

    # Three messages of attempt 1: exactly one claim wins, the others are refused.
    def claim(worker: str) -> Any:
        return api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": worker})

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(claim, ["w1", "w2", "w3"]))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 409, 409], [a.text for a in answers]
    assert {a.json()["code"] for a in answers if a.status_code == 409} == {"claim_refused"}
    time.sleep(RESEND_S + 0.2)
    assert _reaper(api).reap_once().resent == []  # running: never re-sent
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    assert (job["state"], job["attempt"]) == ("running", 1)
    assert api.ledger.closed == []


def test_replicas_resend_a_job_once(make_api: Any) -> None:
    replicas = [make_api(queued_resend_s=RESEND_S) for _ in range(3)]
    job_id, _ = _queued_job(replicas[0])
    time.sleep(RESEND_S + 0.2)
    start = threading.Barrier(len(replicas))

    def reap(api: Api) -> list[tuple[str, int]]:
        start.wait()
        return _reaper(api).reap_once().resent

    with ThreadPoolExecutor(len(replicas)) as pool:
        resent = [r for result in pool.map(reap, replicas) for r in result]
    assert resent == [(job_id, 1)]
    assert sum(len(api.sender.sent) for api in replicas) == 2  # the submit's and one re-send


class _BrokerDown:
    """A task sender whose broker refuses every message."""

    def send_run_job(self, job_id: str, attempt: int) -> None:
        raise ConnectionError("broker unreachable")

    def ping(self) -> bool:
        return False


def test_a_failed_resend_is_retried_at_the_next_pass(make_api: Any) -> None:
    api = make_api(queued_resend_s=RESEND_S)
    job_id, _ = _queued_job(api)
    time.sleep(RESEND_S + 0.2)
    healthy = _reaper(api)
    down = Reaper(healthy.sessions, healthy.ledger, _BrokerDown(), lease_ttl_s=60,
                  max_attempts=3, interval_s=1, queued_resend_s=RESEND_S)
    assert down.reap_once().resent == []
    # Nothing was recorded: the next pass (broker back) sends at once, not a period later.
    assert healthy.reap_once().resent == [(job_id, 1)]
