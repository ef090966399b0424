"""The job state table: the only legal job state changes, who may propose them, and what an
accepted change does besides changing the state.

Only the api applies transitions (under a row lock on the job, in
:func:`dpsynth_api.jobs.service.transition`); workers and users *propose* them. The table
answers each proposal with ACCEPT, REJECT (illegal: an error for the caller) or ABORT
(legal-looking but stale or redundant, e.g. a report from a fenced-off attempt: the caller
must stop what it is doing). Pattern after Prefect's orchestration rules, kept small: an
accepted transition's consequences are declared next to the table (:data:`EFFECTS`), not
repeated at each call site. The states themselves (``JobState``, terminal or not) are a
contract with the worker and the client, in ``dpsynth_shared.job_states``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from dpsynth_shared.job_states import TERMINAL_STATES, JobState

from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Job


class Actor(StrEnum):
    """Who proposes a transition."""

    USER = "user"
    WORKER = "worker"
    REAPER = "reaper"


class Decision(StrEnum):
    """The table's answer to a proposal."""

    ACCEPT = "accept"
    REJECT = "reject"
    ABORT = "abort"


_S, _A = JobState, Actor

# (from, to) -> actors allowed to propose it.
TRANSITIONS: dict[tuple[JobState, JobState], frozenset[Actor]] = {
    (_S.QUEUED, _S.RUNNING): frozenset({_A.WORKER}),  # a claim
    (_S.QUEUED, _S.CANCELLED): frozenset({_A.USER}),
    (_S.QUEUED, _S.FAILED): frozenset({_A.WORKER, _A.REAPER}),
    (_S.RUNNING, _S.SUCCEEDED): frozenset({_A.WORKER}),
    (_S.RUNNING, _S.FAILED): frozenset({_A.WORKER, _A.REAPER}),
    (_S.RUNNING, _S.CANCELLING): frozenset({_A.USER}),
    (_S.RUNNING, _S.INTERRUPTED): frozenset({_A.REAPER, _A.WORKER}),
    (_S.CANCELLING, _S.CANCELLED): frozenset({_A.WORKER, _A.REAPER}),
    # A cancelling job whose worker finished its last step before seeing the request.
    (_S.CANCELLING, _S.SUCCEEDED): frozenset({_A.WORKER}),
    (_S.CANCELLING, _S.FAILED): frozenset({_A.WORKER, _A.REAPER}),
    (_S.INTERRUPTED, _S.QUEUED): frozenset({_A.REAPER}),  # requeue attempt + 1
    (_S.INTERRUPTED, _S.FAILED): frozenset({_A.REAPER}),  # too many attempts
    (_S.INTERRUPTED, _S.CANCELLED): frozenset({_A.USER}),
}


def decide_transition(current: JobState, proposed: JobState, actor: Actor) -> Decision:
    """Answer a proposed transition from the table.

    Args:
        current: the job's state as read under its row lock.
        proposed: the state the actor asks for.
        actor: who proposes it.

    Returns:
        ACCEPT when the table allows it for this actor; ABORT when the job is already
        terminal or already in the proposed state (the proposer is stale and must stop);
        REJECT otherwise.
    """
    if current in TERMINAL_STATES or current == proposed:
        return Decision.ABORT
    allowed = TRANSITIONS.get((current, proposed))
    if allowed is None or actor not in allowed:
        return Decision.REJECT
    return Decision.ACCEPT


Effect = Callable[[Job, LedgerPort], None]
"""What an accepted transition does besides changing the state: called with the locked job
(already in its new state, flushed, not committed) and the ledger."""


@dataclass(frozen=True)
class CloseReservation:
    """Close the job's ledger reservation (when it has one) with ``outcome``.

    It runs under the job's row lock, before the caller commits: no worker can claim the
    job while the ledger releases its budget. A ledger error propagates to the caller, whose
    transaction then rolls back (the job keeps its state and its open reservation).
    """

    outcome: Literal["cancelled", "failed"]

    def __call__(self, job: Job, ledger: LedgerPort) -> None:
        if job.reservation_id:
            ledger.close_reservation(job.reservation_id, self.outcome)


_CLOSE_CANCELLED = CloseReservation("cancelled")
_CLOSE_FAILED = CloseReservation("failed")

# (from, to) -> what the api does after accepting it from a user or the reaper (never from a
# worker: see effects_of). A transition not listed has no effect.
EFFECTS: dict[tuple[JobState, JobState], tuple[Effect, ...]] = {
    # a user cancels a job no worker runs: its reservation is released at once
    (_S.QUEUED, _S.CANCELLED): (_CLOSE_CANCELLED,),
    (_S.INTERRUPTED, _S.CANCELLED): (_CLOSE_CANCELLED,),
    # the reaper ends a cancel whose worker was lost before it could close the reservation
    (_S.CANCELLING, _S.CANCELLED): (_CLOSE_CANCELLED,),
    # the job's task could not be sent (jobs/submit.py): nothing ran, all is released
    (_S.QUEUED, _S.FAILED): (_CLOSE_CANCELLED,),
    # the reaper gives up after too many lost or drained attempts
    (_S.INTERRUPTED, _S.FAILED): (_CLOSE_FAILED,),
}


def effects_of(previous: JobState, proposed: JobState, actor: Actor) -> tuple[Effect, ...]:
    """The effects of an accepted ``previous → proposed`` proposed by ``actor``.

    A worker's proposal has none: the worker closes its own reservation before it proposes
    a terminal state (``dpsynth_worker.runners.outcome``), so the api must not close it again.
    """
    if actor is Actor.WORKER:
        return ()
    return EFFECTS.get((previous, proposed), ())


__all__ = ["EFFECTS", "TRANSITIONS", "Actor", "CloseReservation", "Decision", "Effect",
           "decide_transition", "effects_of"]
