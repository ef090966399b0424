"""The Celery app and its one task, ``dpsynth.run_job(job_id, attempt)``: transport only.

No behaviour relies on broker redelivery: messages are acknowledged late but a lost worker's
message is not re-queued by Celery (``task_reject_on_worker_lost=False``); the api's reaper
requeues lost jobs as attempt + 1, and a redelivered message is refused at claim.

One message is never acknowledged without a claim: when the api could not be reached to
claim the job (it is still ``queued``), the message is rejected with requeue, so it waits in
the broker for the api instead of being lost (issue 14, item 2). A claim the api refused
(cancelled, claimed already, another attempt) is acknowledged and dropped.
"""

from __future__ import annotations

import logging

from celery import Celery
from celery.exceptions import Reject
from celery.signals import worker_shutting_down

from dpsynth_worker.clients import ClaimUnavailable
from dpsynth_worker.runners import run_job
from dpsynth_worker.runtime import current_runtime
from dpsynth_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

TASK_NAME = "dpsynth.run_job"
QUEUE = "dpsynth"


def run_job_task(job_id: str, attempt: int) -> str:
    """Run one attempt of a job; returns the outcome's name (for the worker's own logs)."""
    rt = current_runtime()
    try:
        outcome = run_job(str(job_id), int(attempt), api=rt.api, ledger=rt.ledger,
                          store=rt.store, work_dir=rt.work_dir, worker_id=rt.worker_id,
                          shutdown=rt.shutdown, ml=rt.ml)
    except ClaimUnavailable as exc:
        log.warning("the api could not take the claim; the message goes back to the queue",
                    extra={"job_id": job_id, "attempt": attempt, "why": exc.detail})
        raise Reject(exc.detail, requeue=True) from exc
    except Exception:
        # Crash: leave the job to the api's reaper (the reservation stays open to resume).
        log.exception("job attempt crashed", extra={"job_id": job_id, "attempt": attempt})
        raise
    return str(outcome)


def _on_shutdown(sig: object = None, how: object = None, **_: object) -> None:
    """SIGTERM/SIGINT: the running attempt stops at its next step boundary."""
    log.info("worker shutting down; stopping the running job at a step boundary",
             extra={"signal": str(sig), "how": str(how)})
    try:
        current_runtime().shutdown.set()
    except RuntimeError:
        pass


def create_app(settings: WorkerSettings) -> Celery:
    """The ``Celery("dpsynth")`` app: Redis broker, late acks, prefetch 1, queue ``dpsynth``."""
    app = Celery("dpsynth", broker=settings.broker_url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_reject_on_worker_lost=False,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=settings.queue,
        task_routes={TASK_NAME: {"queue": settings.queue}},
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_concurrency=1,
    )
    app.task(name=TASK_NAME, acks_late=True)(run_job_task)
    worker_shutting_down.connect(_on_shutdown, weak=False)
    return app
