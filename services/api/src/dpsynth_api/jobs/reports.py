"""An evaluate job's report (``GET /v1/jobs/{id}/report``, issue 5, item 3).

The report is two ``kind="report"`` artifacts the worker registered: ``report.json`` (the
:class:`dpsynth_shared.evaluation.EvaluationReport` document) and ``report.html`` (the page).
A report on a PRIVATE reference is owner-only (the api forced it at registration): it holds
metrics computed from private records outside any DP mechanism and, unless the job said
otherwise, private images. The HTML page is served with a Content-Security-Policy that
allows no script, no network fetch and no frame: only inline styles and ``data:`` images.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.evaluation import EvaluationReport
from dpsynth_shared.job_states import JobState, is_terminal
from dpsynth_shared.object_store import PRIVATE_PREFIX
from sqlalchemy.orm import Session

from dpsynth_api.jobs import repository as repo
from dpsynth_api.jobs.service import get_job
from dpsynth_api.ports import ObjectStore
from dpsynth_api.tables import Artifact, Job
from dpsynth_api.tenants.security import Principal, Scope

REPORT_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""The report page may draw inline styles and ``data:`` images, and nothing else."""

REPORT_HEADERS = {"Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff",
                  "Referrer-Policy": "no-referrer", "Cache-Control": "private, no-store",
                  "X-Frame-Options": "DENY"}
"""Headers of both report responses."""

MAX_REPORT_JSON_BYTES = 64 * 1024 * 1024
"""A report.json larger than this is refused rather than parsed in memory."""

Format = Literal["json", "html"]


def _format_of(artifact: Artifact) -> str | None:
    stated = (artifact.info or {}).get("format")
    if stated in ("json", "html"):
        return str(stated)
    name = artifact.object_key.rsplit("/", 1)[-1].lower()
    return "html" if name.endswith(".html") else "json" if name.endswith(".json") else None


def report_artifact(session: Session, job: Job, fmt: Format) -> Artifact | None:
    """The report artifact of the job in that format: the one its result names, else the
    newest of its current attempt."""
    artifacts = [a for a in repo.artifacts_of(session, job.id) if a.kind == "report"]
    named = (job.result or {}).get("report_artifact_id" if fmt == "json"
                                   else "report_html_artifact_id")
    for artifact in artifacts:
        if artifact.id == named:
            return artifact
    candidates = [a for a in artifacts if _format_of(a) == fmt]
    if not candidates:
        return None
    return max(candidates, key=lambda a: (a.attempt, a.created_at, a.id))


def find_report(session: Session, *, principal: Principal, job_id: str,
                fmt: Format) -> Artifact:
    """The job's report artifact, access checked.

    Raises:
        DpsynthError: 404 ``not_found`` for an unknown or another tenant's job and for a job
            that is not an evaluate job; 409 ``conflict`` (``report_state``) while the job
            has no report yet (queued, running, failed, cancelled); 403 ``forbidden`` for an
            owner-only report without the ``owner`` scope.
    """
    job = get_job(session, principal=principal, job_id=job_id)
    if job.type != "evaluate":
        raise NotFound("report", job_id)
    artifact = report_artifact(session, job, fmt)
    if artifact is None:
        state = JobState(job.state)
        finished = is_terminal(state)
        why = f"the job ended {state} without one" if finished else "the job has not finished"
        raise DpsynthError(ErrorCode.CONFLICT, f"evaluate job {job.id} has no {fmt} report "
                           f"yet: {why}", report_state="absent" if finished else "not_ready",
                           job_state=str(state))
    if artifact.owner_only and not principal.has(Scope.OWNER):
        raise DpsynthError(ErrorCode.FORBIDDEN, "this report is owner-only (computed from "
                           "private data outside any DP mechanism): the 'owner' scope is "
                           "required", required_scope="owner")
    if artifact.object_key.startswith(PRIVATE_PREFIX):
        raise DpsynthError(ErrorCode.FORBIDDEN, "private data is never downloadable")
    return artifact


def read_json(store: ObjectStore, artifact: Artifact) -> EvaluationReport:
    """The stored report.json, validated against the contract.

    Raises:
        DpsynthError: 404 when the object is gone; 500 ``internal_error`` when it is too
            large or not a report document.
    """
    info = store.stat(artifact.object_key)
    if info is None:
        raise NotFound("report object", artifact.id)
    if info.size > MAX_REPORT_JSON_BYTES:
        raise DpsynthError(ErrorCode.INTERNAL, "the stored report is too large to serve")
    data = b"".join(store.iter_chunks(artifact.object_key))
    try:
        return EvaluationReport.model_validate_json(data)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INTERNAL, "the stored report is not a valid evaluation "
                           "report document") from exc


def open_html(store: ObjectStore, artifact: Artifact) -> tuple[int, Iterator[bytes]]:
    """The stored page's size and bytes, chunk by chunk."""
    info = store.stat(artifact.object_key)
    if info is None:
        raise NotFound("report object", artifact.id)
    return info.size, store.iter_chunks(artifact.object_key)
