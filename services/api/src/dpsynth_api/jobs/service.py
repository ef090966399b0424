"""Job use cases: the ONE transition function, reading, cancelling.

Every job state change in the api goes through :func:`transition`: it locks the job row
(``SELECT … FOR UPDATE``), asks the state table
(:func:`dpsynth_api.jobs.states.decide_transition`, Prefect-style ACCEPT / REJECT / ABORT)
and applies the accepted transition's declared effects (:data:`dpsynth_api.jobs.states.EFFECTS`:
closing the ledger reservation of a job cancelled or failed by a user or the reaper).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.job_states import JobState, is_terminal
from sqlalchemy.orm import Session

from dpsynth_api.db import utcnow
from dpsynth_api.jobs import repository as repo
from dpsynth_api.jobs.states import Actor, Decision, decide_transition, effects_of
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Artifact, Job
from dpsynth_api.tenants.security import Principal


@dataclass(frozen=True)
class TransitionOutcome:
    decision: Decision
    previous: JobState
    job: Job

    @property
    def accepted(self) -> bool:
        return self.decision is Decision.ACCEPT


def transition(session: Session, *, job_id: str, to_state: JobState, actor: Actor,
               attempt: int | None = None,
               ledger: LedgerPort | None = None) -> TransitionOutcome:
    """Lock the job and apply ``to_state`` when the state table accepts it (flush only),
    then the transition's declared effects, still under the row lock and before the commit.

    Args:
        session: the caller's session; the caller commits.
        job_id: the job.
        to_state: the proposed state.
        actor: who proposes it (user, worker or reaper).
        attempt: when given, the proposer's attempt; another attempt gets 409 ``stale_attempt``.
        ledger: the ledger the effects close reservations at; required of a caller whose
            transition can have one (a user's cancel, the reaper, a failed send).

    Returns:
        The decision, the state before, and the (locked) job; on REJECT / ABORT nothing changed.

    Raises:
        DpsynthError: an effect's ledger error (the caller rolls back: nothing changed).
    """
    job = repo.lock(session, job_id)
    if job is None:
        raise NotFound("job", job_id)
    if attempt is not None and attempt != job.attempt:
        raise DpsynthError(ErrorCode.STALE_ATTEMPT,
                           f"attempt {attempt} is stale: the job is at attempt {job.attempt}",
                           current_attempt=job.attempt)
    previous = JobState(job.state)
    decision = decide_transition(previous, to_state, actor)
    if decision is Decision.ACCEPT:
        effects = effects_of(previous, to_state, actor)
        if effects and ledger is None:
            raise TypeError(f"the transition {previous} -> {to_state} by the {actor} has "
                            "effects at the ledger: pass the ledger")
        now = utcnow()
        job.state = str(to_state)
        job.updated_at = now
        if to_state is JobState.RUNNING:
            job.started_at = now
        if is_terminal(to_state):
            job.finished_at = now
        session.flush()
        if ledger is not None:  # never None when there are effects (checked above)
            for effect in effects:
                effect(job, ledger)
    return TransitionOutcome(decision, previous, job)


def refuse(outcome: TransitionOutcome, to_state: JobState) -> DpsynthError:
    """The 409 ``invalid_transition`` of a refused proposal."""
    return DpsynthError(ErrorCode.INVALID_TRANSITION,
                        f"a job in state '{outcome.previous}' cannot move to '{to_state}'",
                        state=str(outcome.previous), proposed=str(to_state),
                        decision=str(outcome.decision))


def get_job(session: Session, *, principal: Principal, job_id: str) -> Job:
    """The tenant's job or 404 ``not_found``."""
    job = repo.get_for_tenant(session, tenant_id=principal.tenant_id, job_id=job_id)
    if job is None:
        raise NotFound("job", job_id)
    return job


def job_artifacts(session: Session, *, job: Job) -> list[Artifact]:
    """The artifacts a job registered, oldest first."""
    return repo.artifacts_of(session, job.id)


def list_jobs(session: Session, *, principal: Principal, limit: int, cursor: str | None,
              state: JobState | None, job_type: str | None
              ) -> tuple[list[Job], dict[str, list[Artifact]]]:
    """One page of the tenant's jobs (``limit + 1`` rows) and their artifacts."""
    jobs = repo.list_for_tenant(session, tenant_id=principal.tenant_id, limit=limit,
                                cursor=cursor, state=str(state) if state else None,
                                job_type=job_type)
    return jobs, repo.artifacts_of_jobs(session, [j.id for j in jobs])


def cancel_job(session: Session, *, principal: Principal, ledger: LedgerPort,
               job_id: str) -> Job:
    """Cancel a job: queued / interrupted → cancelled (its ledger reservation closed
    ``cancelled`` under the row lock), running → cancelling (the worker stops and closes it).

    Raises:
        DpsynthError: 404 for another tenant's job, 409 ``invalid_transition`` when terminal.
    """
    job = get_job(session, principal=principal, job_id=job_id)
    target = JobState.CANCELLING if job.state == JobState.RUNNING else JobState.CANCELLED
    # queued / interrupted -> cancelled closes the reservation (an effect of the transition,
    # jobs/states.py) under the row lock, before the commit: no worker can claim the job
    # while the ledger releases it.
    outcome = transition(session, job_id=job.id, to_state=target, actor=Actor.USER,
                         ledger=ledger)
    if not outcome.accepted:
        if outcome.previous is JobState.CANCELLING:
            session.rollback()
            return outcome.job  # already being cancelled: idempotent
        session.rollback()
        raise refuse(outcome, target)
    session.commit()
    return outcome.job
