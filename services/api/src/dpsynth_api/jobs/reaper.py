"""The reaper: finds jobs whose worker was lost and requeues or ends them.

1. ``running`` / ``cancelling`` jobs whose heartbeat is older than ``lease_ttl_s`` become
   ``interrupted`` / ``cancelled`` (the latter closes the ledger reservation ``cancelled``:
   an effect of the transition, ``jobs/states.py``).
2. ``interrupted`` jobs are requeued with attempt + 1 (a new task is sent after the commit),
   or end ``failed`` (``too_many_attempts``, reservation closed ``failed``) after
   ``max_attempts`` lost attempts or ``max_drained_attempts`` drains. A drain is an attempt
   the worker ended itself on SIGTERM (error code ``worker_shutdown``: it stopped at a step
   boundary and checkpointed); every other interruption is a lost attempt. Rolling deploys
   and scale-downs drain workers, and must not fail a healthy job.
3. ``queued`` jobs whose task was sent more than ``queued_resend_s`` ago and that no worker
   claimed get their task sent again (same attempt), at most once per ``queued_resend_s``:
   the message may be gone (a broker that lost its data, an api that died between commit
   and send). A duplicate of a message still waiting in a busy queue is harmless: the
   claim is fenced, exactly one claim of an attempt wins and the other is refused.

Each job is handled in its own transaction, picked with ``FOR UPDATE SKIP LOCKED``, through
the one transition function with actor REAPER, so several api replicas can reap at once. A
ledger error while a transition closes a reservation rolls that job's transaction back and
is logged; the pass goes on with the next job, and the next pass tries that one again.

After each pass (also one cut short by an error) the report's counts go to ``on_pass``: the
app counts them in ``dpsynth_api_jobs_resent_total`` and
``dpsynth_api_jobs_reaped_total{outcome}`` (metrics.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from dpsynth_shared.job_states import WORKER_SHUTDOWN, JobState
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_api.db import utcnow
from dpsynth_api.jobs import repository as repo
from dpsynth_api.jobs.service import transition
from dpsynth_api.jobs.states import Actor
from dpsynth_api.ports import LedgerPort, TaskSender

log = logging.getLogger(__name__)
TOO_MANY_ATTEMPTS = "too_many_attempts"


@dataclass
class ReapReport:
    interrupted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    requeued: list[tuple[str, int]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resent: list[tuple[str, int]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """How many jobs each step of the pass handled (keys: the field names)."""
        return {"interrupted": len(self.interrupted), "cancelled": len(self.cancelled),
                "requeued": len(self.requeued), "failed": len(self.failed),
                "resent": len(self.resent)}


@dataclass
class Reaper:
    """Reaps lost jobs every ``interval_s`` in a daemon thread (start/stop with the app)."""

    sessions: sessionmaker[Session]
    ledger: LedgerPort
    sender: TaskSender
    lease_ttl_s: int
    max_attempts: int
    interval_s: float
    max_drained_attempts: int = 50
    queued_resend_s: int = 1800
    # called with each pass's report, even one an error cut short (the app's metrics)
    on_pass: Callable[[ReapReport], None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the background thread (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dpsynth-reaper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.reap_once()
            except Exception:
                log.exception("reaper pass failed")

    def reap_once(self) -> ReapReport:
        """One pass over lapsed, interrupted and long-unclaimed queued jobs."""
        report = ReapReport()
        try:
            self._expire_lapsed(report)
            self._requeue_interrupted(report)
            self._resend_unclaimed(report)
        finally:
            if self.on_pass is not None:
                try:
                    self.on_pass(report)
                except Exception:
                    log.exception("reaper pass callback failed")
        return report

    def _expire_lapsed(self, report: ReapReport) -> None:
        tried: set[str] = set()
        cutoff = utcnow() - timedelta(seconds=self.lease_ttl_s)
        while True:
            with self.sessions() as session:
                job_id = repo.next_lapsed(session, states=("running", "cancelling"),
                                          older_than=cutoff, exclude=tried)
                if job_id is None:
                    return
                tried.add(job_id)
                try:
                    self._expire_one(session, job_id, report)
                except Exception:
                    session.rollback()
                    log.exception("could not reap a lapsed job", extra={"job_id": job_id})

    def _expire_one(self, session: Session, job_id: str, report: ReapReport) -> None:
        job = repo.lock(session, job_id)
        assert job is not None
        cancelling = job.state == JobState.CANCELLING
        target = JobState.CANCELLED if cancelling else JobState.INTERRUPTED
        # cancelling -> cancelled closes the reservation 'cancelled' (jobs/states.py)
        outcome = transition(session, job_id=job_id, to_state=target, actor=Actor.REAPER,
                             ledger=self.ledger)
        if not outcome.accepted:
            session.rollback()
            return
        outcome.job.error_code = "worker_lost"
        outcome.job.error_message = (f"no heartbeat for {self.lease_ttl_s}s during attempt "
                                     f"{outcome.job.attempt}")
        session.commit()
        (report.cancelled if cancelling else report.interrupted).append(job_id)
        log.warning("job lost its worker", extra={"job_id": job_id, "state": str(target)})

    def _requeue_interrupted(self, report: ReapReport) -> None:
        tried: set[str] = set()
        while True:
            with self.sessions() as session:
                job_id = repo.next_in_state(session, state="interrupted", exclude=tried)
                if job_id is None:
                    return
                tried.add(job_id)
                try:
                    sent = self._requeue_one(session, job_id, report)
                except Exception:
                    session.rollback()
                    log.exception("could not requeue a job", extra={"job_id": job_id})
                    continue
            if sent is not None:
                self.sender.send_run_job(*sent)  # after the commit
                report.requeued.append(sent)

    def _requeue_one(self, session: Session, job_id: str,
                     report: ReapReport) -> tuple[str, int] | None:
        job = repo.lock(session, job_id)
        assert job is not None
        drained = job.drained_attempts + (1 if job.error_code == WORKER_SHUTDOWN else 0)
        lost = job.attempt - drained
        give_up = lost >= self.max_attempts or drained >= self.max_drained_attempts
        target = JobState.FAILED if give_up else JobState.QUEUED
        # interrupted -> failed closes the reservation 'failed' (jobs/states.py)
        outcome = transition(session, job_id=job_id, to_state=target, actor=Actor.REAPER,
                             ledger=self.ledger)
        if not outcome.accepted:
            session.rollback()
            return None
        job = outcome.job
        job.drained_attempts = drained
        if give_up:
            job.error_code = TOO_MANY_ATTEMPTS
            job.error_message = (
                f"the job lost its worker {lost} times (max_attempts {self.max_attempts})"
                if lost >= self.max_attempts else
                f"the job's worker was shut down {drained} times "
                f"(max_drained_attempts {self.max_drained_attempts})")
            session.commit()
            report.failed.append(job_id)
            return None
        job.attempt += 1
        job.heartbeat_at = None
        job.worker_id = None
        job.error_code = None
        job.error_message = None
        session.commit()
        return job.id, job.attempt

    def _resend_unclaimed(self, report: ReapReport) -> None:
        """Send again the task of each queued job left unclaimed for ``queued_resend_s``.

        The send happens under the row lock, before the commit that records it in
        ``updated_at``: a failed send leaves the row as it was (retried next pass), and a
        worker's claim of the new message waits for the commit. The pass stops at the first
        failed send (the broker is down; every other send would fail too).
        """
        tried: set[str] = set()
        now = utcnow()
        cutoff = now - timedelta(seconds=self.queued_resend_s)
        while True:
            with self.sessions() as session:
                job_id = repo.next_unclaimed(session, older_than=cutoff, exclude=tried)
                if job_id is None:
                    return
                tried.add(job_id)
                job = repo.lock(session, job_id)
                assert job is not None
                waited_s, attempt = (now - job.updated_at).total_seconds(), job.attempt
                job.updated_at = now
                try:
                    self.sender.send_run_job(job_id, attempt)
                except Exception:
                    session.rollback()
                    log.exception("could not re-send a queued job", extra={"job_id": job_id})
                    return
                session.commit()
            report.resent.append((job_id, attempt))
            log.warning("re-sent the task of a queued job no worker claimed", extra={
                "job_id": job_id, "attempt": attempt, "unclaimed_s": round(waited_s, 1)})
