"""Bodies of the artifact endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dpsynth_api.tables import Artifact


class ArtifactOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    artifact_id: str
    job_id: str
    attempt: int
    kind: str
    size: int
    sha256: str
    owner_only: bool
    non_dp: bool = Field(description="computed from private data outside a DP mechanism")
    checkpoint_step: int | None = None
    model_id: str | None = None
    labels: dict[str, Any] = Field(default_factory=dict)
    filename: str
    created_at: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]


class Presigned(BaseModel):
    url: str
    expires_at: datetime
    sha256: str | None = Field(None, description="sha256 of the object behind the URL: for a "
                               "corpus, its release (its manifest lists the non-DP "
                               "evaluations that preceded it), which differs from the "
                               "stored corpus's once there are any")
    non_dp_evaluations: int | None = Field(None, description="corpus: how many non-DP "
                                           "evaluations on private data its manifest lists")


def filename_of(artifact: Artifact) -> str:
    """The download name: the key's last component, prefixed by the job id."""
    return f"{artifact.job_id}-{artifact.object_key.rsplit('/', 1)[-1]}"


def artifact_out(artifact: Artifact) -> ArtifactOut:
    return ArtifactOut(
        artifact_id=artifact.id, job_id=artifact.job_id, attempt=artifact.attempt,
        kind=artifact.kind, size=artifact.size_bytes, sha256=artifact.sha256,
        owner_only=artifact.owner_only, non_dp=artifact.non_dp,
        checkpoint_step=artifact.checkpoint_step, model_id=artifact.model_id,
        labels=artifact.info or {}, filename=filename_of(artifact), created_at=artifact.created_at)
