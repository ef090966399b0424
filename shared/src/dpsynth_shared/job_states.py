"""The job state table: the only legal job state changes, and who may propose them.

Only the api applies transitions (under a row lock on the job); workers and users *propose*
them. The table answers each proposal with ACCEPT, REJECT (illegal: an error for the caller)
or ABORT (legal-looking but stale or redundant, e.g. a report from a fenced-off attempt:
the caller must stop what it is doing). Pattern after Prefect's orchestration rules.

    queued ──claim──▶ running ──▶ succeeded | failed
      │                 │  └──lost worker──▶ interrupted ──requeue──▶ queued (attempt + 1)
      │                 └──cancel──▶ cancelling ──worker stops──▶ cancelled
      └──cancel──▶ cancelled
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


# The error_code a worker proposes with ``interrupted`` when it was shut down gracefully
# (SIGTERM: it stopped at a step boundary and checkpointed). The api's reaper counts such
# drains apart from lost attempts, so rolling deploys and scale-downs do not fail a job.
WORKER_SHUTDOWN = "worker_shutdown"


class Actor(StrEnum):
    USER = "user"
    WORKER = "worker"
    REAPER = "reaper"


class Decision(StrEnum):
    ACCEPT = "accept"
    REJECT = "reject"
    ABORT = "abort"


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)

# (from, to) -> actors allowed to propose it.
TRANSITIONS: dict[tuple[JobState, JobState], frozenset[Actor]] = {
    (JobState.QUEUED, JobState.RUNNING): frozenset({Actor.WORKER}),  # a claim
    (JobState.QUEUED, JobState.CANCELLED): frozenset({Actor.USER}),
    (JobState.QUEUED, JobState.FAILED): frozenset({Actor.WORKER, Actor.REAPER}),
    (JobState.RUNNING, JobState.SUCCEEDED): frozenset({Actor.WORKER}),
    (JobState.RUNNING, JobState.FAILED): frozenset({Actor.WORKER, Actor.REAPER}),
    (JobState.RUNNING, JobState.CANCELLING): frozenset({Actor.USER}),
    (JobState.RUNNING, JobState.INTERRUPTED): frozenset({Actor.REAPER, Actor.WORKER}),
    (JobState.CANCELLING, JobState.CANCELLED): frozenset({Actor.WORKER, Actor.REAPER}),
    # A cancelling job whose worker finished its last step before seeing the request.
    (JobState.CANCELLING, JobState.SUCCEEDED): frozenset({Actor.WORKER}),
    (JobState.CANCELLING, JobState.FAILED): frozenset({Actor.WORKER, Actor.REAPER}),
    (JobState.INTERRUPTED, JobState.QUEUED): frozenset({Actor.REAPER}),  # requeue attempt + 1
    (JobState.INTERRUPTED, JobState.FAILED): frozenset({Actor.REAPER}),  # too many attempts
    (JobState.INTERRUPTED, JobState.CANCELLED): frozenset({Actor.USER}),
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


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL_STATES
