"""Artifact endpoints (transport only)."""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import APIRouter, Request
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
from dpsynth_api.openapi import BINARY

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.get("/artifacts/{artifact_id}", response_model=ArtifactOut)
def get_artifact(artifact_id: str, session: SessionDep, principal: ReaderDep) -> ArtifactOut:
    """Artifact metadata: kind, job, size, sha256, owner_only, non_dp, labels."""
    return artifact_out(service.get_artifact(session, principal=principal,
                                             artifact_id=artifact_id))


@router.get("/artifacts/{artifact_id}/download", response_model=None,
            responses={200: {"model": Presigned,
                             "content": {"application/octet-stream": {"schema": BINARY}},
                             "description": "the bytes, or with presign=true a JSON URL"}})
def download(artifact_id: str, request: Request, session: SessionDep, principal: ReaderDep,
             store: StoreDep, settings: SettingsDep,
             presign: bool = False) -> StreamingResponse | Presigned:
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
        presigned = service.presign(store, artifact, ttl_s=settings.object_store.presign_ttl_s,
                                    release=release)
        if presigned.url.startswith("/"):  # the local store's /v1/presigned/<token>
            presigned.url = str(request.base_url).rstrip("/") + presigned.url
        return presigned
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


@router.get("/presigned/{token}", response_model=None,
            responses={200: {"content": {"application/octet-stream": {"schema": BINARY}},
                             "description": "the presigned corpus"}})
def presigned_download(token: str, store: StoreDep) -> StreamingResponse:
    """A presigned URL of the local object store (no key: the token is the credential).

    The token is opaque (sealed by the store, ``dpsynth_shared.stores.local``): it names
    a synthetic corpus and an expiry, never a file path. An invalid, altered or expired
    token, or a store that signs its own URLs (S3), is a 404.
    """
    resolve = getattr(store, "resolve_presigned", None)
    if resolve is None:
        raise DpsynthError(ErrorCode.NOT_FOUND, "this presigned URL is invalid or has expired",
                           resource="presigned URL")
    key: str = resolve(token)
    info = store.stat(key)
    if info is None:
        raise DpsynthError(ErrorCode.NOT_FOUND, "this presigned URL is invalid or has expired",
                           resource="presigned URL")
    headers = {"Content-Disposition": f'attachment; filename="{key.rsplit("/", 1)[-1]}"',
               "Content-Length": str(info.size), "X-Dpsynth-Sha256": info.sha256}
    return StreamingResponse(store.iter_chunks(key), media_type="application/octet-stream",
                             headers=headers)
