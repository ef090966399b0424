"""Artifact endpoints (transport only)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from dpsynth_api.artifacts import releases, service
from dpsynth_api.artifacts.schemas import (
    ArtifactList,
    ArtifactOut,
    Presigned,
    artifact_out,
    filename_of,
)
from dpsynth_api.deps import ReaderDep, SessionDep, SettingsDep, StoreDep

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.get("/artifacts/{artifact_id}", response_model=ArtifactOut)
def get_artifact(artifact_id: str, session: SessionDep, principal: ReaderDep) -> ArtifactOut:
    """Artifact metadata: kind, job, size, sha256, owner_only, non_dp, labels."""
    return artifact_out(service.get_artifact(session, principal=principal,
                                             artifact_id=artifact_id))


@router.get("/artifacts/{artifact_id}/download", response_model=None,
            responses={200: {"content": {"application/octet-stream": {}},
                             "description": "the bytes, or with presign=true a JSON URL"}})
def download(artifact_id: str, session: SessionDep, principal: ReaderDep, store: StoreDep,
             settings: SettingsDep, presign: bool = False) -> StreamingResponse | Presigned:
    """Stream an artifact; ``?presign=true`` gives a short-lived URL (corpora only).

    A corpus is served as its current RELEASE: the stored zip with a ``manifest.json``
    whose ``non_dp_evaluations`` lists every non-DP evaluation on private data (of the
    corpus, or of a budget its model was trained on) that a worker started before this
    download (docs/privacy.md "Evaluations and corpus releases").
    """
    artifact = service.get_artifact(session, principal=principal, artifact_id=artifact_id)
    release = (releases.release_of(session, store, artifact) if artifact.kind == "corpus"
               else None)
    if presign:
        return service.presign(store, artifact, ttl_s=settings.object_store.presign_ttl_s,
                               release=release)
    size, chunks = service.open_download(store, artifact, release)
    headers = {"Content-Disposition": f'attachment; filename="{filename_of(artifact)}"',
               "Content-Length": str(size)}
    if release is not None:
        headers["X-Dpsynth-Release-Sha256"] = release.info.sha256
        headers["X-Dpsynth-Non-Dp-Evaluations"] = str(len(release.evaluations))
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)


@router.get("/jobs/{job_id}/artifacts", response_model=ArtifactList)
def job_artifacts(job_id: str, session: SessionDep, principal: ReaderDep) -> ArtifactList:
    """The artifacts a job produced."""
    items = service.list_job_artifacts(session, principal=principal, job_id=job_id)
    return ArtifactList(items=[artifact_out(a) for a in items])
