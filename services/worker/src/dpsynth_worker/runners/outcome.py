"""How an attempt ends: proposals to the api and reservation closes at the ledger."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_states import WORKER_SHUTDOWN, JobState
from dpsynth_shared.worker_contract import ProposeTransition

from dpsynth_worker.ports import CloseOutcome
from dpsynth_worker.runners.heartbeat import FENCED_CODES

if TYPE_CHECKING:
    from dpsynth_worker.runners.context import JobContext
    from dpsynth_worker.runners.hooks import LeasedHooks

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What a worker did with one task message (a metrics label, data-independent)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    REFUSED = "refused"      # the claim was refused: a redelivered or stale message
    ABORTED = "aborted"      # the api or ledger fenced this attempt off mid-way


def propose(ctx: JobContext, state: JobState, *, error_code: str | None = None,
            message: str | None = None, result: Mapping[str, object] | None = None) -> None:
    """Propose the job's next state; a fenced-off attempt's proposal is dropped quietly."""
    proposal = ProposeTransition(attempt=ctx.attempt, to_state=state, error_code=error_code,
                                 message=message, result=dict(result or {}))
    try:
        ctx.api.propose_transition(ctx.job_id, proposal)
    except DpsynthError as exc:
        if exc.code not in FENCED_CODES:
            raise
        log.warning("transition proposal refused", extra={"to_state": str(state),
                                                          "code": str(exc.code)})


def close_reservation(ctx: JobContext, outcome: CloseOutcome) -> None:
    """Close the attempt's ledger reservation, if the job has one."""
    rid = ctx.claim.reservation_id
    if rid is None:
        return
    try:
        ctx.ledger.close_reservation(rid, outcome=outcome)
    except DpsynthError as exc:
        if exc.code not in FENCED_CODES:
            raise
        log.warning("reservation close refused", extra={"code": str(exc.code)})


def fail(ctx: JobContext, code: str, message: str) -> Outcome:
    """End the job ``failed``: close its reservation (if any), then propose the state."""
    close_reservation(ctx, "failed")
    propose(ctx, JobState.FAILED, error_code=code, message=message[:2000])
    return Outcome.FAILED


def stopped(ctx: JobContext) -> Outcome:
    """End an attempt that stopped at a step boundary: cancelled, fenced off or SIGTERM."""
    if ctx.flags.stale.is_set():
        log.warning("attempt fenced off; stopping without reporting")
        return Outcome.ABORTED
    if ctx.flags.cancel.is_set():
        close_reservation(ctx, "cancelled")
        propose(ctx, JobState.CANCELLED)
        return Outcome.CANCELLED
    # SIGTERM: granted steps stay charged; the api requeues attempt + 1, which resumes
    # from the last checkpoint under fresh leases (docs/privacy.md, "Charging"). The code tells
    # the reaper this was a drain, not a lost worker, so it does not use up max_attempts.
    propose(ctx, JobState.INTERRUPTED, error_code=WORKER_SHUTDOWN,
            message="worker shut down; the job will resume")
    return Outcome.INTERRUPTED


def unfinished_training(ctx: JobContext, hooks: LeasedHooks, *, stopped_early: bool,
                        steps: int) -> Outcome | None:
    """The outcome of a leased DP training attempt that did not finish (a stale attempt, a
    budget the ledger refused, a stop at a step boundary), or None when it finished.

    A stop that is not a cancel ends the lease (its granted steps stay charged) so the next
    attempt resumes from the last checkpoint.
    """
    if ctx.flags.stale.is_set():
        return stopped(ctx)
    if hooks.budget_refused:
        return fail(ctx, ErrorCode.PRIVACY_BUDGET_EXHAUSTED,
                    "the ledger refused further steps (privacy budget exhausted); "
                    "the last checkpoint is kept")
    if stopped_early:
        log.info("training stopped at a step boundary",
                 extra={"step": steps, "cancelled": ctx.flags.cancel.is_set(),
                        "shutdown": ctx.flags.shutdown.is_set()})
        if not ctx.flags.cancel.is_set():
            hooks.end_lease()
        return stopped(ctx)
    return None
