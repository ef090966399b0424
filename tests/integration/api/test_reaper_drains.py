"""Graceful drains (a worker's SIGTERM: ``interrupted`` with ``worker_shutdown``) do not use
up a job's ``max_attempts``; only lost attempts (no heartbeat, or an interruption without
that code) do, and drains have their own, larger cap."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from dpsynth_api.db import utcnow
from dpsynth_api.jobs.reaper import Reaper
from dpsynth_api.tables import Job

from tests.integration.api.conftest import Api, auth


def _job(api: Api, token: str, job_id: str) -> dict[str, Any]:
    return api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()  # type: ignore[no-any-return]


def _end_attempt(api: Api, reaper: Reaper, job_id: str, attempt: int, how: str) -> None:
    """Claim ``attempt`` and end it as a worker would: ``drained`` (SIGTERM), ``stopped``
    (interrupted without the drain code) or ``lost`` (the heartbeat lapses)."""
    assert api.worker(f"{job_id}/claim", {"attempt": attempt, "worker_id": "w"}
                      ).status_code == 200
    if how == "lost":
        # Age the heartbeat past the lease instead of sleeping through lease_ttl_s.
        with reaper.sessions() as session:
            job = session.get(Job, job_id)
            assert job is not None
            job.heartbeat_at = utcnow() - timedelta(seconds=reaper.lease_ttl_s + 5)
            session.commit()
        return
    body: dict[str, Any] = {"attempt": attempt, "to_state": "interrupted",
                            "message": "worker shut down; the job will resume"}
    if how == "drained":
        body["error_code"] = "worker_shutdown"
    r = api.worker(f"{job_id}/transition", body)
    assert r.status_code == 200, r.text


def _run(make_api: Any, sequence: list[str], **settings: Any
         ) -> tuple[Api, str, list[dict[str, Any]]]:
    """Submit one finetune and end its attempts as ``sequence`` says, one reaper pass after
    each; returns the api, the job id and the job's view after each pass."""
    api = make_api(lease_ttl_s=30, **settings)
    reaper: Reaper = api.client.app.state.reaper  # type: ignore[attr-defined]
    _, token = api.tenant()
    private, model = api.private_dataset(token), api.model(token)
    job_id = api.finetune(token, private, model).json()["job_id"]
    views = []
    for attempt, how in enumerate(sequence, start=1):
        _end_attempt(api, reaper, job_id, attempt, how)
        reaper.reap_once()
        views.append(_job(api, token, job_id))
    return api, job_id, views


def test_drained_jobs_are_requeued_past_max_attempts(make_api: Any) -> None:
    api, job_id, views = _run(make_api, ["drained"] * 5, max_attempts=3)
    assert [(v["state"], v["attempt"], v["drained_attempts"]) for v in views] == [
        ("queued", n + 1, n) for n in range(1, 6)]
    assert views[-1]["error"] is None
    assert api.sender.sent == [(job_id, n) for n in range(1, 7)]
    assert api.ledger.closed == []  # the reservation stays open across attempts


@pytest.mark.parametrize("how", ["lost", "stopped"])
def test_lost_attempts_still_fail_after_max_attempts(make_api: Any, how: str) -> None:
    api, job_id, views = _run(make_api, [how] * 3, max_attempts=3)
    assert [(v["state"], v["attempt"]) for v in views] == [
        ("queued", 2), ("queued", 3), ("failed", 3)]
    assert views[-1]["drained_attempts"] == 0
    assert api.sender.sent == [(job_id, 1), (job_id, 2), (job_id, 3)]
    assert views[-1]["error"] == {"code": "too_many_attempts",
                                  "message": "the job lost its worker 3 times "
                                             "(max_attempts 3)"}
    assert api.ledger.closed == [(views[-1]["privacy"]["reservation_id"], "failed")]


def test_mixed_sequences_count_only_the_lost_attempts(make_api: Any) -> None:
    sequence = ["drained", "lost", "drained", "stopped", "drained", "lost"]
    _, _, views = _run(make_api, sequence, max_attempts=3)
    assert [(v["state"], v["attempt"], v["drained_attempts"]) for v in views] == [
        ("queued", 2, 1), ("queued", 3, 1), ("queued", 4, 2), ("queued", 5, 2),
        ("queued", 6, 3), ("failed", 6, 3)]
    assert views[-1]["error"]["message"] == "the job lost its worker 3 times (max_attempts 3)"


def test_the_drain_cap_fails_the_job_with_its_own_message(make_api: Any) -> None:
    api, _, views = _run(make_api, ["lost", "drained", "drained"], max_attempts=3,
                            max_drained_attempts=2)
    assert [(v["state"], v["attempt"], v["drained_attempts"]) for v in views] == [
        ("queued", 2, 0), ("queued", 3, 1), ("failed", 3, 2)]
    assert views[-1]["error"] == {
        "code": "too_many_attempts",
        "message": "the job's worker was shut down 2 times (max_drained_attempts 2)"}
    assert api.ledger.closed == [(views[-1]["privacy"]["reservation_id"], "failed")]
