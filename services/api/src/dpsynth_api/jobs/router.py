"""Job endpoints (transport only)."""

from __future__ import annotations

from typing import Annotated, Literal

from dpsynth_shared.job_specs import JobSpec
from dpsynth_shared.job_states import JobState
from fastapi import APIRouter, Body, Query, Response

from dpsynth_api.deps import LedgerDep, ReaderDep, SenderDep, SessionDep, SubmitterDep
from dpsynth_api.jobs import service, submit
from dpsynth_api.jobs.schemas import DryRun, JobOut, JobPage, job_out
from dpsynth_api.pagination import split
from dpsynth_api.tenants.security import Scope

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobOut | DryRun)
def submit_job(spec: Annotated[JobSpec, Body()], response: Response, session: SessionDep,
               principal: SubmitterDep, ledger: LedgerDep, sender: SenderDep,
               dry_run: bool = False) -> JobOut | DryRun:
    """Submit a job; ``?dry_run=true`` returns the plan and budget impact, storing nothing."""
    if dry_run:
        response.status_code = 200
        return submit.plan_job(session, principal=principal, ledger=ledger, spec=spec)
    job = submit.submit_job(session, principal=principal, ledger=ledger, sender=sender,
                            spec=spec)
    return job_out(job, [], owner=principal.has(Scope.OWNER))


@router.get("", response_model=JobPage)
def list_jobs(session: SessionDep, principal: ReaderDep,
              limit: Annotated[int, Query(ge=1, le=200)] = 50, cursor: str | None = None,
              state: JobState | None = None,
              type: Literal["pretrain", "finetune", "generate"] | None = None) -> JobPage:
    """The tenant's jobs, newest first, filtered by state and type."""
    jobs, artifacts = service.list_jobs(session, principal=principal, limit=limit, cursor=cursor,
                                        state=state, job_type=type)
    rows, next_cursor = split(jobs, limit)
    owner = principal.has(Scope.OWNER)
    return JobPage(items=[job_out(j, artifacts.get(j.id, []), owner=owner) for j in rows],
                   next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, session: SessionDep, principal: ReaderDep) -> JobOut:
    """A job: state, progress, privacy block, artifacts, error."""
    job = service.get_job(session, principal=principal, job_id=job_id)
    return job_out(job, service.job_artifacts(session, job=job),
                   owner=principal.has(Scope.OWNER))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, session: SessionDep, principal: SubmitterDep,
               ledger: LedgerDep) -> JobOut:
    """Cancel a job (queued/interrupted: now; running: the worker stops at its next step)."""
    job = service.cancel_job(session, principal=principal, ledger=ledger, job_id=job_id)
    return job_out(job, service.job_artifacts(session, job=job),
                   owner=principal.has(Scope.OWNER))
