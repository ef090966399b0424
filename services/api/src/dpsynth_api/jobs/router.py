"""Job endpoints (transport only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from dpsynth_shared.evaluation import EvaluationReport
from dpsynth_shared.job_specs import JobSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType
from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import StreamingResponse

from dpsynth_api.deps import (
    LedgerDep,
    ReaderDep,
    SenderDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    SubmitterDep,
)
from dpsynth_api.jobs import reports, service, submit
from dpsynth_api.jobs.audits import latest_audit
from dpsynth_api.jobs.schemas import DryRun, JobOut, JobPage, job_out
from dpsynth_api.pagination import split
from dpsynth_api.tenants.security import Scope

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=None, responses={
    201: {"model": JobOut, "description": "the job, queued"},
    200: {"model": DryRun | JobOut, "description": "dry_run=true: the plan and its budget "
          "impact (DryRun); or, for a pretrain identical to one of the tenant's succeeded "
          "pretrains (same settings, same data content; spec `reuse`), that earlier job "
          "(JobOut): nothing runs again"}})
def submit_job(spec: Annotated[JobSpec, Body()], response: Response, session: SessionDep,
               principal: SubmitterDep, ledger: LedgerDep, sender: SenderDep,
               settings: SettingsDep, dry_run: bool = False) -> JobOut | DryRun:
    """Submit a job; ``?dry_run=true`` returns the plan and budget impact, storing nothing."""
    if dry_run:
        response.status_code = 200
        return submit.plan_job(session, principal=principal, ledger=ledger, spec=spec,
                               limits=settings.plan_limits)
    job, reused = submit.submit_job(session, principal=principal, ledger=ledger,
                                    sender=sender, spec=spec, limits=settings.plan_limits)
    if reused:
        response.status_code = 200  # an identical earlier pretraining
        return job_out(job, service.job_artifacts(session, job=job),
                       owner=principal.has(Scope.OWNER))
    return job_out(job, [], owner=principal.has(Scope.OWNER))


@router.get("", response_model=JobPage)
def list_jobs(session: SessionDep, principal: ReaderDep,
              limit: Annotated[int, Query(ge=1, le=200)] = 50, cursor: str | None = None,
              state: JobState | None = None,
              type: JobType | None = None) -> JobPage:
    """The tenant's jobs, newest first, filtered by state and type."""
    jobs, artifacts = service.list_jobs(session, principal=principal, limit=limit, cursor=cursor,
                                        state=state, job_type=type)
    rows, next_cursor = split(jobs, limit)
    owner = principal.has(Scope.OWNER)
    return JobPage(items=[job_out(j, artifacts.get(j.id, []), owner=owner) for j in rows],
                   next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, session: SessionDep, principal: ReaderDep) -> JobOut:
    """A job: state, progress, privacy block, artifacts, error; a finetune's latest
    matching privacy audit, or 'not_audited'."""
    job = service.get_job(session, principal=principal, job_id=job_id)
    view = job_out(job, service.job_artifacts(session, job=job),
                   owner=principal.has(Scope.OWNER))
    view.audit = latest_audit(session, job)
    return view


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, session: SessionDep, principal: SubmitterDep,
               ledger: LedgerDep) -> JobOut:
    """Cancel a job (queued/interrupted: now; running: the worker stops at its next step)."""
    job = service.cancel_job(session, principal=principal, ledger=ledger, job_id=job_id)
    return job_out(job, service.job_artifacts(session, job=job),
                   owner=principal.has(Scope.OWNER))


_PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}}


@router.get("/{job_id}/report", response_model=EvaluationReport, responses={
    200: {"description": "the report.json document, or with format=html the page",
          "content": {"text/html": {"schema": {"type": "string"}}}},
    403: {"description": "owner-only report (private reference) without the 'owner' "
          "scope", **_PROBLEM},
    404: {"description": "unknown job, another tenant's job, or not an evaluate job",
          **_PROBLEM},
    409: {"description": "the job has no report (yet): report_state 'not_ready' while it "
          "runs, 'absent' when it ended without one", **_PROBLEM}})
def get_report(job_id: str, session: SessionDep, principal: ReaderDep, store: StoreDep,
               format: Literal["json", "html"] = "json") -> Response:
    """An evaluate job's report: the JSON document (headline numbers, classifier scores,
    feature-network check, memorisation), or ``?format=html`` the page (served under a
    strict Content-Security-Policy: no script, only inline styles and ``data:`` images).

    A report on a PRIVATE reference is owner-only and labelled non-DP (``non_dp``): it is
    computed from private records outside any DP mechanism.
    """
    artifact = reports.find_report(session, principal=principal, job_id=job_id, fmt=format)
    if format == "html":
        size, chunks = reports.open_html(store, artifact)
        return StreamingResponse(chunks, media_type="text/html; charset=utf-8", headers={
            **reports.REPORT_HEADERS, "Content-Length": str(size),
            "Content-Disposition": f'inline; filename="{job_id}-report.html"'})
    document = reports.read_json(store, artifact)
    return Response(document.model_dump_json(), media_type="application/json",
                    headers=reports.REPORT_HEADERS)
