"""Typed identifiers.

Ids are opaque strings ``<prefix>_<32 hex>``; the prefix tells a reader what an id names,
and makes it impossible to pass a job id where a dataset id is expected without a cast.
"""

from __future__ import annotations

import re
import uuid
from typing import NewType

TenantId = NewType("TenantId", str)
ApiKeyId = NewType("ApiKeyId", str)
DatasetId = NewType("DatasetId", str)
ModelId = NewType("ModelId", str)
JobId = NewType("JobId", str)
ArtifactId = NewType("ArtifactId", str)
ReservationId = NewType("ReservationId", str)
LeaseId = NewType("LeaseId", str)

PREFIXES = {
    "tenant": "ten",
    "api_key": "key",
    "dataset": "ds",
    "model": "mdl",
    "job": "job",
    "artifact": "art",
    "reservation": "res",
    "lease": "lse",
    "grant": "grt",
    "release": "rel",
}

_ID_RE = re.compile(r"^[a-z]{2,4}_[0-9a-f]{32}$")


def new_id(kind: str) -> str:
    """Return a fresh random id for ``kind`` (a key of :data:`PREFIXES`)."""
    return f"{PREFIXES[kind]}_{uuid.uuid4().hex}"


def new_tenant_id() -> TenantId:
    return TenantId(new_id("tenant"))


def new_dataset_id() -> DatasetId:
    return DatasetId(new_id("dataset"))


def new_model_id() -> ModelId:
    return ModelId(new_id("model"))


def new_job_id() -> JobId:
    return JobId(new_id("job"))


def new_artifact_id() -> ArtifactId:
    return ArtifactId(new_id("artifact"))


def new_reservation_id() -> ReservationId:
    return ReservationId(new_id("reservation"))


def new_lease_id() -> LeaseId:
    return LeaseId(new_id("lease"))


def is_valid_id(value: str, kind: str | None = None) -> bool:
    """True when ``value`` looks like an id (of ``kind`` when given)."""
    if not _ID_RE.match(value):
        return False
    return kind is None or value.startswith(PREFIXES[kind] + "_")
