"""Artifact use cases: metadata, streamed downloads, presigned corpus URLs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.object_store import PRIVATE_PREFIX, check_presign_allowed
from sqlalchemy.orm import Session

from dpsynth_api.artifacts.releases import Release
from dpsynth_api.artifacts.schemas import Presigned
from dpsynth_api.db import utcnow
from dpsynth_api.jobs import repository as jobs_repo
from dpsynth_api.jobs.service import get_job
from dpsynth_api.ports import ObjectStore
from dpsynth_api.tables import Artifact
from dpsynth_api.tenants.security import Principal, Scope


def get_artifact(session: Session, *, principal: Principal, artifact_id: str) -> Artifact:
    """The tenant's artifact; owner-only ones need the ``owner`` scope (403)."""
    artifact = session.get(Artifact, artifact_id)
    if artifact is None or artifact.tenant_id != principal.tenant_id:
        raise NotFound("artifact", artifact_id)
    if artifact.owner_only and not principal.has(Scope.OWNER):
        raise DpsynthError(ErrorCode.FORBIDDEN, "this artifact is owner-only (non-DP "
                           "statistics of private data): the 'owner' scope is required",
                           required_scope="owner")
    return artifact


def list_job_artifacts(session: Session, *, principal: Principal, job_id: str) -> list[Artifact]:
    """A job's artifacts (owner-only ones only for owner keys)."""
    job = get_job(session, principal=principal, job_id=job_id)
    owner = principal.has(Scope.OWNER)
    return [a for a in jobs_repo.artifacts_of(session, job.id) if owner or not a.owner_only]


def open_download(store: ObjectStore, artifact: Artifact,
                  release: Release | None = None) -> tuple[int, Iterator[bytes]]:
    """The stored size and the artifact's bytes, chunk by chunk (never a private dataset);
    for a corpus, its ``release`` (``artifacts/releases.py``)."""
    key = release.key if release is not None else artifact.object_key
    if artifact.object_key.startswith(PRIVATE_PREFIX) or key.startswith(PRIVATE_PREFIX):
        raise DpsynthError(ErrorCode.FORBIDDEN, "private data is never downloadable")
    info = release.info if release is not None else store.stat(key)
    if info is None:
        raise NotFound("artifact object", artifact.id)
    return info.size, store.iter_chunks(key)


def presign(store: ObjectStore, artifact: Artifact, *, ttl_s: int,
            release: Release | None = None) -> Presigned:
    """A short-lived URL; only synthetic corpora (403 ``presign_refused`` otherwise), and
    for a corpus the URL of its current release."""
    if artifact.kind != "corpus" or artifact.owner_only:
        raise DpsynthError(ErrorCode.PRESIGN_REFUSED, "only synthetic corpora can be presigned")
    key = release.key if release is not None else artifact.object_key
    check_presign_allowed(key)
    expires_at = utcnow() + timedelta(seconds=ttl_s)
    return Presigned(url=store.presign_get(key, ttl=timedelta(seconds=ttl_s)),
                     expires_at=expires_at,
                     sha256=release.info.sha256 if release is not None else artifact.sha256,
                     non_dp_evaluations=len(release.evaluations) if release is not None
                     else None)
