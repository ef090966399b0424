"""Worker use cases: claim (fenced by attempt), heartbeat, register artifacts, propose
transitions. Workers never change state themselves: the api decides through
:func:`dpsynth_api.jobs.service.transition`."""

from __future__ import annotations

import re
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import new_artifact_id
from dpsynth_shared.job_states import JobState, is_terminal
from dpsynth_shared.worker_contract import (
    Claim,
    ClaimRequest,
    Heartbeat,
    HeartbeatReply,
    ProposeTransition,
    RegisterArtifact,
    RegisteredArtifact,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.db import utcnow
from dpsynth_api.internal.lineage import build_claim, register_model
from dpsynth_api.jobs import repository as jobs_repo
from dpsynth_api.jobs.schemas import result_keys
from dpsynth_api.jobs.service import refuse, transition
from dpsynth_api.jobs.states import Actor
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tables import Artifact, Dataset, Job

_LIVE = (JobState.RUNNING, JobState.CANCELLING)
_PRIVATE_STAT = re.compile(r"loss|grad|clip", re.IGNORECASE)
# Public hyperparameters whose names look like statistics: set by the user, not computed
# from the data (the clipping norm C is part of the published DP mechanism).
_PUBLIC_HYPERPARAMETERS = frozenset({"max_grad_norm"})
_PREFIX = {"model": "models/", "checkpoint": "checkpoints/{job}/", "corpus": "corpora/{job}/",
           "private_stats": "owner/{job}/", "report": "reports/{job}/"}
# Reports may also live under the owner-only prefix of their job.
_OTHER_PREFIXES = {"report": ("owner/{job}/",)}


def _locked_live(session: Session, job_id: str, attempt: int) -> Job:
    """The job under its row lock, when ``attempt`` is its current, live attempt."""
    job = jobs_repo.lock(session, job_id)
    if job is None:
        raise NotFound("job", job_id)
    if attempt != job.attempt or job.state not in _LIVE:
        raise DpsynthError(ErrorCode.STALE_ATTEMPT,
                           f"attempt {attempt} no longer runs (job at attempt {job.attempt}, "
                           f"state {job.state}): stop", current_attempt=job.attempt,
                           state=job.state)
    return job


def claim_job(session: Session, *, settings: ApiSettings, job_id: str,
              request: ClaimRequest) -> Claim:
    """Accept a claim only for a ``queued`` job at this attempt → ``running``; else 409
    ``claim_refused`` (a redelivered or stale message is dropped by the worker)."""
    job = jobs_repo.lock(session, job_id)
    if job is None:
        raise NotFound("job", job_id)
    if job.state != JobState.QUEUED or job.attempt != request.attempt:
        raise DpsynthError(ErrorCode.CLAIM_REFUSED,
                           f"job is {job.state} at attempt {job.attempt}; attempt "
                           f"{request.attempt} cannot claim it", state=job.state,
                           current_attempt=job.attempt)
    outcome = transition(session, job_id=job_id, to_state=JobState.RUNNING, actor=Actor.WORKER,
                         attempt=request.attempt)
    if not outcome.accepted:
        raise refuse(outcome, JobState.RUNNING)
    job.heartbeat_at = utcnow()
    job.worker_id = request.worker_id
    claim = build_claim(session, job=job, settings=settings)
    session.commit()
    return claim


def heartbeat(session: Session, *, job_id: str, beat: Heartbeat) -> HeartbeatReply:
    """Record data-independent progress; the reply says whether cancel was requested."""
    job = _locked_live(session, job_id, beat.attempt)
    job.progress_step, job.progress_total = beat.step, beat.total
    job.epsilon_so_far, job.eta_s, job.progress_message = (beat.epsilon_so_far, beat.eta_s,
                                                           beat.message)
    job.heartbeat_at = utcnow()
    state = JobState(job.state)
    session.commit()
    return HeartbeatReply(cancel_requested=state is JobState.CANCELLING, state=state)


def _check_artifact(job: Job, body: RegisterArtifact, owner_only: bool) -> None:
    prefix = _PREFIX[body.kind].format(job=job.id)
    allowed = (prefix, *(p.format(job=job.id) for p in _OTHER_PREFIXES.get(body.kind, ())))
    if job.type == "audit":
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "audit jobs register no artifacts: the "
                           "model an audit trains is the audit's and is not kept")
    if body.kind == "report" and job.type != "evaluate":
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "only evaluate jobs register reports")
    if not body.object_key.startswith(allowed):
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"a {body.kind} artifact of this job must live under '{prefix}'")
    if not owner_only:
        leaked = sorted(k for k in body.metadata
                        if _PRIVATE_STAT.search(k) and k not in _PUBLIC_HYPERPARAMETERS)
        if leaked:
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               f"metadata keys {leaked} look like statistics of private data; "
                               "they belong in an owner-only private_stats artifact")


def _private_report(session: Session, job: Job, body: RegisterArtifact) -> bool:
    """A report of an evaluate job on a PRIVATE reference: owner-only and non-DP whatever
    the worker says (it is computed from private records outside any DP mechanism)."""
    if body.kind != "report":
        return False
    reference = session.get(Dataset, job.dataset_id) if job.dataset_id else None
    return reference is None or reference.visibility != "public"


def register_artifact(session: Session, *, job_id: str,
                      body: RegisterArtifact) -> RegisteredArtifact:
    """Register an output; ``model`` also records a model with its lineage."""
    job = _locked_live(session, job_id, body.attempt)
    stats = body.kind == "private_stats" or _private_report(session, job, body)
    owner_only, non_dp = body.owner_only or stats, body.non_dp or stats
    _check_artifact(job, body, owner_only)
    existing = session.scalars(select(Artifact).where(
        Artifact.job_id == job.id, Artifact.object_key == body.object_key)).first()
    if existing is not None:  # a retried registration
        return RegisteredArtifact(artifact_id=existing.id, model_id=existing.model_id)
    artifact = Artifact(id=new_artifact_id(), tenant_id=job.tenant_id, job_id=job.id,
                        attempt=body.attempt, kind=body.kind, object_key=body.object_key,
                        sha256=body.sha256, size_bytes=body.size, owner_only=owner_only,
                        non_dp=non_dp, checkpoint_step=body.checkpoint_step,
                        info=dict(body.metadata))
    if body.kind == "model":
        artifact.model_id = register_model(session, job=job, body=body).id
    session.add(artifact)
    session.commit()
    return RegisteredArtifact(artifact_id=artifact.id, model_id=artifact.model_id)


def _apply_result(job: Job, result: dict[str, Any]) -> None:
    kept = {k: v for k, v in result.items() if k in result_keys(job.type)}
    job.result = {**(job.result or {}), **kept}
    if "job_epsilon" in kept and job.privacy is not None:
        job.privacy = {**job.privacy, "job_epsilon_spent": kept["job_epsilon"]}


def propose_transition(session: Session, *, job_id: str, body: ProposeTransition) -> Job:
    """Apply a worker's proposed state through the state table (409 when refused)."""
    outcome = transition(session, job_id=job_id, to_state=body.to_state, actor=Actor.WORKER,
                         attempt=body.attempt)
    job = outcome.job
    if not outcome.accepted:
        session.rollback()
        if outcome.previous is body.to_state:
            return job  # a retried proposal that already took effect
        raise refuse(outcome, body.to_state)
    if body.to_state is JobState.FAILED or body.error_code:
        job.error_code = body.error_code or "worker_failed"
        job.error_message = body.message
    _apply_result(job, body.result)
    if is_terminal(body.to_state) and body.to_state is JobState.SUCCEEDED:
        job.progress_step = max(job.progress_step, job.progress_total)
    session.commit()
    return job
