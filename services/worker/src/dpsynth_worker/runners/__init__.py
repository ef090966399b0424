"""Runners: one attempt of a job, from claim to proposed final state.

:func:`run_job` claims the attempt (fenced by its number, so a redelivered message never
runs a job twice), runs the runner of its type with heartbeats, maps domain errors to a
``failed`` proposal, and deletes the attempt's work dir. An unexpected exception propagates:
the worker dies or the task fails, and the api's reaper takes over (the reservation is then
left open so the next attempt resumes it).
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_types import JobType
from dpsynth_shared.logging import job_id_var
from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.worker_contract import Claim

from dpsynth_worker import metrics
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.ml_port import MlPort
from dpsynth_worker.ports import ApiPort, LedgerPort
from dpsynth_worker.runners.audit import run_audit
from dpsynth_worker.runners.context import JobContext, StopFlags
from dpsynth_worker.runners.dp_train import run_dp_train
from dpsynth_worker.runners.evaluate import EvaluationInputError, run_evaluate
from dpsynth_worker.runners.feature_net import run_feature_net
from dpsynth_worker.runners.finetune import run_finetune
from dpsynth_worker.runners.generate import run_generate
from dpsynth_worker.runners.heartbeat import FENCED_CODES, Heartbeater
from dpsynth_worker.runners.outcome import Outcome, fail
from dpsynth_worker.runners.pretrain import run_pretrain

log = logging.getLogger(__name__)

RUNNERS: dict[JobType, Callable[[JobContext], Outcome]] = {
    JobType.PRETRAIN: run_pretrain, JobType.FINETUNE: run_finetune,
    JobType.GENERATE: run_generate, JobType.FEATURE_NET: run_feature_net,
    JobType.EVALUATE: run_evaluate, JobType.AUDIT: run_audit, JobType.DP_TRAIN: run_dp_train}

#: Failures of an evaluation on private data whose detail concerns only public inputs (the
#: feature network's check on its public validation records, the worker's Inception weights).
_PUBLIC_DETAIL_CODES = frozenset({ErrorCode.FEATURE_NETWORK_REJECTED,
                                  ErrorCode.INCEPTION_UNAVAILABLE})

#: Codes that mean "try again later": the attempt crashes and the reaper requeues it.
TRANSIENT_CODES = frozenset({ErrorCode.LEDGER_UNAVAILABLE, ErrorCode.SERVICE_UNAVAILABLE,
                             ErrorCode.INTERNAL})


def run_job(job_id: str, attempt: int, *, api: ApiPort, ledger: LedgerPort, store: ObjectStore,
            work_dir: Path, worker_id: str, ml: MlPort | None = None,
            shutdown: threading.Event | None = None,
            heartbeat_s: float | None = None) -> Outcome:
    """Claim and run one attempt of a job.

    Args:
        job_id: the job.
        attempt: the attempt the task message names.
        api: the api's internal endpoints.
        ledger: the ledger.
        store: the object store.
        work_dir: parent of the attempt's scratch folder (deleted at the end).
        worker_id: this worker's id (claims and read grants name it).
        ml: the ML core (:class:`MlAdapter`, the real one, by default).
        shutdown: set by the process on SIGTERM: stop at the next step boundary.
        heartbeat_s: overrides the claim's heartbeat interval (tests).

    Returns:
        What happened; ``refused`` when the claim was refused and nothing ran.
    """
    token = job_id_var.set(job_id)
    try:
        try:
            claim = api.claim(job_id, attempt=attempt, worker_id=worker_id)
        except DpsynthError as exc:
            if exc.code != ErrorCode.CLAIM_REFUSED:
                raise
            log.info("claim refused; dropping the message", extra={"attempt": attempt})
            metrics.CLAIMS_REFUSED.inc()
            return Outcome.REFUSED
        metrics.JOBS_STARTED.labels(type=claim.type).inc()
        outcome = _run_claimed(claim, api=api, ledger=ledger, store=store, work_dir=work_dir,
                               worker_id=worker_id,
                               ml=ml if ml is not None else MlAdapter(),
                               shutdown=shutdown or threading.Event(), heartbeat_s=heartbeat_s)
        metrics.JOBS_FINISHED.labels(type=claim.type, outcome=str(outcome)).inc()
        log.info("attempt finished", extra={"attempt": attempt, "outcome": str(outcome)})
        return outcome
    finally:
        job_id_var.reset(token)


def _run_claimed(claim: Claim, *, api: ApiPort, ledger: LedgerPort, store: ObjectStore,
                 work_dir: Path, worker_id: str, ml: MlPort, shutdown: threading.Event,
                 heartbeat_s: float | None) -> Outcome:
    flags = StopFlags(shutdown=shutdown)
    scratch = Path(work_dir) / f"{claim.job_id}-attempt-{claim.attempt}"
    scratch.mkdir(parents=True, exist_ok=True)
    interval = float(claim.heartbeat_s if heartbeat_s is None else heartbeat_s)
    beats = Heartbeater(api, job_id=claim.job_id, attempt=claim.attempt, interval_s=interval,
                        flags=flags)
    ctx = JobContext(claim=claim, api=api, ledger=ledger, store=store, work_dir=scratch,
                     worker_id=worker_id, ml=ml, flags=flags, heartbeat=beats)
    log.info("job claimed", extra={"attempt": claim.attempt, "job_type": claim.type})
    try:
        with beats:
            try:
                return RUNNERS[claim.type](ctx)
            except Exception as exc:
                code = _domain_code(exc)
                if code is None or code in TRANSIENT_CODES:
                    raise
                if code in FENCED_CODES or flags.stale.is_set():
                    log.warning("attempt fenced off", extra={"code": code})
                    return Outcome.ABORTED
                log.warning("job failed", extra={"code": code})
                return fail(ctx, code, _failure_message(claim, exc, code))
    finally:
        metrics.JOB_STEP.set(0)
        shutil.rmtree(scratch, ignore_errors=True)


def _domain_code(exc: BaseException) -> str | None:
    """The stable code of a domain error (the platform's or the ML core's), else None."""
    if isinstance(exc, DpsynthError):
        return str(exc.code)
    ml = sys.modules.get("dpsynth_ml")
    if ml is not None and isinstance(exc, ml.MlError):
        return str(exc.code)
    return None


def _failure_message(claim: Claim, exc: BaseException, code: str) -> str:
    """A message for the job; for a DP job it never repeats details (they may name records)."""
    if claim.type == "finetune":
        return f"the finetune failed ({code}); details are withheld as they may concern " \
               "private data"
    if claim.type == "evaluate" and (claim.dataset is None
                                     or claim.dataset.visibility != "public"):
        # only errors about the non-private inputs (the spec, the corpus, the worker's
        # configuration) and the feature network's check on PUBLIC data keep their detail
        if isinstance(exc, EvaluationInputError) or code in _PUBLIC_DETAIL_CODES:
            return str(exc)[:2000]
        return f"the evaluation failed ({code}); details are withheld as they may concern " \
               "private data"
    return str(exc)[:2000]


__all__ = ["RUNNERS", "Outcome", "run_job"]
