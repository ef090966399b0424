"""``/internal/v1``: the worker's endpoints (transport only, worker token)."""

from __future__ import annotations

from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import (
    Claim,
    ClaimRequest,
    Heartbeat,
    HeartbeatReply,
    ProposeTransition,
    RegisterArtifact,
    RegisteredArtifact,
)
from fastapi import APIRouter

from dpsynth_api.deps import SessionDep, SettingsDep, WorkerDep
from dpsynth_api.internal import service
from dpsynth_api.internal.schemas import TransitionReply

router = APIRouter(prefix="/internal/v1/jobs", tags=["internal"], dependencies=[WorkerDep])


@router.post("/{job_id}/claim", response_model=Claim)
def claim(job_id: str, body: ClaimRequest, session: SessionDep, settings: SettingsDep) -> Claim:
    """Claim a queued job for one attempt (409 ``claim_refused`` otherwise)."""
    return service.claim_job(session, settings=settings, job_id=job_id, request=body)


@router.post("/{job_id}/heartbeat", response_model=HeartbeatReply)
def heartbeat(job_id: str, body: Heartbeat, session: SessionDep) -> HeartbeatReply:
    """Progress of the live attempt (409 ``stale_attempt`` for any other)."""
    return service.heartbeat(session, job_id=job_id, beat=body)


@router.post("/{job_id}/artifacts", status_code=201, response_model=RegisteredArtifact)
def register_artifact(job_id: str, body: RegisterArtifact,
                      session: SessionDep) -> RegisteredArtifact:
    """Register an uploaded output (a ``model`` also becomes a model with lineage)."""
    return service.register_artifact(session, job_id=job_id, body=body)


@router.post("/{job_id}/transition", response_model=TransitionReply)
def propose_transition(job_id: str, body: ProposeTransition,
                       session: SessionDep) -> TransitionReply:
    """Propose a state; the api decides with the state table."""
    job = service.propose_transition(session, job_id=job_id, body=body)
    return TransitionReply(job_id=job.id, state=JobState(job.state), attempt=job.attempt)
