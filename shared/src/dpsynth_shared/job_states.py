"""The job states: a contract between the api, the worker and the client.

Only the api applies state changes; workers and users *propose* them. Which changes are
legal, who may propose each and what an accepted one does besides changing the state is
the api's table (``dpsynth_api.jobs.states``):

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


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)


def is_terminal(state: JobState) -> bool:
    """Whether a job in ``state`` is over (no transition leaves it)."""
    return state in TERMINAL_STATES
