"""The job state table, exhaustively: every (from, to, actor) triple."""

from __future__ import annotations

import itertools

import pytest
from dpsynth_api.jobs.states import TRANSITIONS, Actor, Decision, decide_transition
from dpsynth_shared.job_states import TERMINAL_STATES, JobState

S, A = JobState, Actor
# The expected table, written out independently of TRANSITIONS.
ACCEPTED = {
    (S.QUEUED, S.RUNNING, A.WORKER), (S.QUEUED, S.CANCELLED, A.USER),
    (S.QUEUED, S.FAILED, A.WORKER), (S.QUEUED, S.FAILED, A.REAPER),
    (S.RUNNING, S.SUCCEEDED, A.WORKER), (S.RUNNING, S.FAILED, A.WORKER),
    (S.RUNNING, S.FAILED, A.REAPER), (S.RUNNING, S.CANCELLING, A.USER),
    (S.RUNNING, S.INTERRUPTED, A.REAPER), (S.RUNNING, S.INTERRUPTED, A.WORKER),
    (S.CANCELLING, S.CANCELLED, A.WORKER), (S.CANCELLING, S.CANCELLED, A.REAPER),
    (S.CANCELLING, S.SUCCEEDED, A.WORKER), (S.CANCELLING, S.FAILED, A.WORKER),
    (S.CANCELLING, S.FAILED, A.REAPER), (S.INTERRUPTED, S.QUEUED, A.REAPER),
    (S.INTERRUPTED, S.FAILED, A.REAPER), (S.INTERRUPTED, S.CANCELLED, A.USER),
}
ALL = list(itertools.product(JobState, JobState, Actor))


def _expected(current: JobState, proposed: JobState, actor: Actor) -> Decision:
    if current in TERMINAL_STATES or current == proposed:
        return Decision.ABORT
    return Decision.ACCEPT if (current, proposed, actor) in ACCEPTED else Decision.REJECT


@pytest.mark.parametrize(("current", "proposed", "actor"), ALL)
def test_every_triple(current: JobState, proposed: JobState, actor: Actor) -> None:
    assert decide_transition(current, proposed, actor) is _expected(current, proposed, actor)


def test_table_matches_the_written_expectation() -> None:
    from_table = {(f, t, a) for (f, t), actors in TRANSITIONS.items() for a in actors}
    assert from_table == ACCEPTED
    assert len(ALL) == 7 * 7 * 3


def test_terminal_states_accept_nothing() -> None:
    for current in TERMINAL_STATES:
        assert {decide_transition(current, p, a) for p in JobState for a in Actor} == {
            Decision.ABORT}
