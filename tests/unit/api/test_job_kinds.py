"""The api's job kinds and the state table's effects (issue 16, item 1).

The admission table is the mirror of the worker's ``RUNNERS`` (tests/unit/shared/
test_job_types.py): one entry per ``JobType``, each admitting the spec of its own kind. The
effects close a reservation exactly where the api closed it before they were declared: a
user's cancel of a job no worker runs, the reaper's end of a lost cancel and its give-up,
and a task the broker refused; never on a worker's proposal (the worker closes its own).
"""

from __future__ import annotations

import typing
from typing import Any, cast

import pytest
from dpsynth_api.jobs.kinds import ADMISSIONS
from dpsynth_api.jobs.states import (
    EFFECTS,
    TRANSITIONS,
    Actor,
    CloseReservation,
    effects_of,
)
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Job
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType

S = JobState


def test_every_job_type_has_one_admission() -> None:
    assert set(ADMISSIONS) == set(JobType)


@pytest.mark.parametrize("job_type", list(JobType))
def test_each_admission_takes_the_spec_of_its_own_kind(job_type: JobType) -> None:
    spec_class = typing.get_type_hints(ADMISSIONS[job_type])["spec"]
    assert spec_class.model_fields["type"].default == job_type.value


# The closes the api made before the effects were declared, written out independently.
CLOSES = {(S.QUEUED, S.CANCELLED): "cancelled", (S.INTERRUPTED, S.CANCELLED): "cancelled",
          (S.CANCELLING, S.CANCELLED): "cancelled", (S.QUEUED, S.FAILED): "cancelled",
          (S.INTERRUPTED, S.FAILED): "failed"}


def test_effects_close_exactly_where_the_api_closed() -> None:
    declared = {pair: [cast(CloseReservation, e).outcome for e in effects]
                for pair, effects in EFFECTS.items()}
    assert declared == {pair: [outcome] for pair, outcome in CLOSES.items()}


def test_every_effect_belongs_to_a_transition_the_api_itself_makes() -> None:
    for pair in EFFECTS:
        assert TRANSITIONS[pair] - {Actor.WORKER}


@pytest.mark.parametrize("pair", list(TRANSITIONS))
def test_a_workers_proposal_has_no_effect(pair: tuple[JobState, JobState]) -> None:
    assert effects_of(*pair, Actor.WORKER) == ()
    for actor in (Actor.USER, Actor.REAPER):
        assert effects_of(*pair, actor) == EFFECTS.get(pair, ())


class _Closes:
    """Records the reservation closes it is asked for (the only ledger call an effect makes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def close_reservation(self, reservation_id: str, outcome: Any) -> None:
        self.calls.append((reservation_id, outcome))


def test_close_reservation_closes_the_jobs_reservation_only_when_it_has_one() -> None:
    ledger = _Closes()
    effect = CloseReservation("failed")
    effect(Job(id="job_1", reservation_id="rsv_1"), cast(LedgerPort, ledger))
    effect(Job(id="job_2", reservation_id=None), cast(LedgerPort, ledger))
    assert ledger.calls == [("rsv_1", "failed")]
