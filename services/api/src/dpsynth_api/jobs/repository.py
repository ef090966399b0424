"""SQL for jobs (flush only). Row locks: ``FOR UPDATE`` for state changes, ``SKIP LOCKED``
for the reaper so that several api replicas never work on one job at once."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dpsynth_api import pagination
from dpsynth_api.tables import Artifact, Job


def add(session: Session, job: Job) -> Job:
    session.add(job)
    session.flush()
    return job


def get_for_tenant(session: Session, *, tenant_id: str, job_id: str) -> Job | None:
    job = session.get(Job, job_id)
    return job if job is not None and job.tenant_id == tenant_id else None


def lock(session: Session, job_id: str) -> Job | None:
    """The job row under ``SELECT … FOR UPDATE`` (fresh from the database)."""
    stmt = select(Job).where(Job.id == job_id).with_for_update().execution_options(
        populate_existing=True)
    return session.scalars(stmt).first()


def list_for_tenant(session: Session, *, tenant_id: str, limit: int, cursor: str | None,
                    state: str | None, job_type: str | None) -> list[Job]:
    stmt = select(Job).where(Job.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if job_type is not None:
        stmt = stmt.where(Job.type == job_type)
    return list(session.scalars(pagination.page(stmt, Job, limit=limit, cursor=cursor)))


def next_lapsed(session: Session, *, states: Collection[str], older_than: datetime,
                exclude: Collection[str]) -> str | None:
    """One job in ``states`` whose heartbeat is older than ``older_than``, locked, skipping
    rows another replica holds."""
    stmt = (select(Job.id)
            .where(Job.state.in_(list(states)), Job.heartbeat_at < older_than,
                   Job.id.not_in(list(exclude) or [""]))
            .order_by(Job.heartbeat_at).limit(1).with_for_update(skip_locked=True))
    return session.scalars(stmt).first()


def next_unclaimed(session: Session, *, older_than: datetime,
                   exclude: Collection[str]) -> str | None:
    """One ``queued`` job whose task was last sent before ``older_than`` (entering
    ``queued`` and a re-send both set ``updated_at``), locked, skipping rows another replica
    or a claim holds."""
    stmt = (select(Job.id)
            .where(Job.state == "queued", Job.updated_at < older_than,
                   Job.id.not_in(list(exclude) or [""]))
            .order_by(Job.updated_at).limit(1).with_for_update(skip_locked=True))
    return session.scalars(stmt).first()


def next_in_state(session: Session, *, state: str, exclude: Collection[str]) -> str | None:
    """One job in ``state``, locked, skipping rows another replica holds."""
    stmt = (select(Job.id).where(Job.state == state, Job.id.not_in(list(exclude) or [""]))
            .order_by(Job.updated_at).limit(1).with_for_update(skip_locked=True))
    return session.scalars(stmt).first()


def count_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state))
    return {state: int(n) for state, n in rows}


def artifacts_of(session: Session, job_id: str) -> list[Artifact]:
    stmt = select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.created_at,
                                                                      Artifact.id)
    return list(session.scalars(stmt))


def artifacts_of_jobs(session: Session, job_ids: list[str]) -> dict[str, list[Artifact]]:
    out: dict[str, list[Artifact]] = {j: [] for j in job_ids}
    if job_ids:
        stmt = select(Artifact).where(Artifact.job_id.in_(job_ids)).order_by(
            Artifact.created_at, Artifact.id)
        for artifact in session.scalars(stmt):
            out[artifact.job_id].append(artifact)
    return out


def latest_checkpoint(session: Session, job_id: str) -> Artifact | None:
    stmt = (select(Artifact)
            .where(Artifact.job_id == job_id, Artifact.kind == "checkpoint")
            .order_by(Artifact.checkpoint_step.desc().nulls_last(), Artifact.created_at.desc())
            .limit(1))
    return session.scalars(stmt).first()
