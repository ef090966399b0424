"""ORM tables of the api (schema ``api``). Migrations in ``migrations/api`` mirror them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from dpsynth_api.db import Base, utcnow

_TS = DateTime(timezone=True)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    # Policy: no private dataset of the tenant may have a limit above this (None: no cap).
    max_dataset_epsilon_limit: Mapped[float | None] = mapped_column(Float, nullable=True)


class ApiKey(Base):
    """An API key: only the sha256 of its 256-bit secret is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(_TS)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    visibility: Mapped[str] = mapped_column(String(10))
    object_key: Mapped[str] = mapped_column(String(300))
    source_format: Mapped[str] = mapped_column(String(10))
    true_size: Mapped[int] = mapped_column(Integer)
    declared_size: Mapped[int] = mapped_column(Integer)
    # How N̂ was made public (issue 13, item 2): "declared", "dp_count" (charged; the release
    # in size_release) or "true_count" (public data, replace-one); None: before migration 0009.
    declared_size_source: Mapped[str | None] = mapped_column(String(20), nullable=True)
    size_release: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    class_names: Mapped[list[str]] = mapped_column(JSON)
    class_counts: Mapped[dict[str, int]] = mapped_column(JSON)
    image_shape: Mapped[list[int]] = mapped_column(JSON)
    delta: Mapped[float | None] = mapped_column(Float)
    epsilon_limit: Mapped[float | None] = mapped_column(Float)
    neighbouring: Mapped[str | None] = mapped_column(String(20))
    declared_public_by: Mapped[str | None] = mapped_column(String(40))
    uploaded_by: Mapped[str] = mapped_column(String(40))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    # One layout mask per image in the canonical npz (private with a private dataset).
    has_masks: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Public per-class sizes N̂_c declared by the owner (per-label training); None: none.
    class_sizes: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    # "declared" (at upload) or "dp_histogram" (released by a charged DP histogram).
    class_sizes_source: Mapped[str | None] = mapped_column(String(20), nullable=True)
    # The ledger budget this (private) dataset charges: its own id for an original upload;
    # the parent's budget for a derived dataset or an upload linked to an overlapping one.
    budget_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    parent_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # How the dataset was derived: {"kind": "subset"|"split"|"link", ...}; None: an upload.
    derivation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Deletion removes the data, never the row's budget link or the record hashes.
    deleted_at: Mapped[datetime | None] = mapped_column(_TS, nullable=True)
    # "image" or "subject" (private datasets); subject_count: true number of subjects (owner).
    privacy_unit: Mapped[str | None] = mapped_column(String(10), nullable=True)
    subject_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Every unit (image or subject) falls in one declared class (per-label parallel comp.).
    partitions_disjoint: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    warning_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Held-out records set aside at upload (datasets/holdout.py): a second canonical npz
    # beside the object, excluded from true_size, class_counts and N̂; never trained on.
    holdout_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the seed of a split made before migration 0008 (seeded_permutation_v0); never shown
    holdout_seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    holdout_size: Mapped[int | None] = mapped_column(Integer, nullable=True)  # images
    holdout_units: Mapped[int | None] = mapped_column(Integer, nullable=True)
    holdout_object_key: Mapped[str | None] = mapped_column(String(300), nullable=True)
    holdout_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    holdout_size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # "keyed_hash_v1" (a keyed hash of each unit: 1-stable) or "seeded_permutation_v0"
    # (made before migration 0008; its guarantee covers the training part only), or
    # "folder_split_v1" (holdout_from: the split folder the owner put each record in).
    holdout_rule: Mapped[str | None] = mapped_column(String(30), nullable=True)
    # "owner" (a write-only holdout_key, never stored) or "platform" (OS entropy, discarded).
    holdout_key_source: Mapped[str | None] = mapped_column(String(10), nullable=True)


class RecordHash(Base):
    """The content hash of one uploaded record; outlives the deletion of its dataset.

    The hash is sha256 over the record's canonical decoded pixels (dtype, shape, bytes), so
    a re-encoded copy of the same image (PNG vs npz) has the same hash. Overlap checks are
    within a tenant only: telling a tenant that ANOTHER tenant holds an image would itself
    leak membership.
    """

    __tablename__ = "record_hashes"
    __table_args__ = (Index("ix_record_hashes_tenant_hash", "tenant_id", "record_hash"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    record_hash: Mapped[str] = mapped_column(String(64))
    dataset_id: Mapped[str] = mapped_column(String(40), index=True)
    budget_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    visibility: Mapped[str] = mapped_column(String(10))
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    # An image row (migration 0008 on): its position in the upload, its side of the held-out
    # split and its class index; a subject row: its side only. Null: not recorded.
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    held_out: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    label: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Model(Base):
    """A model folder in the store, uploaded or produced by a job, with its lineage."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    object_key: Mapped[str] = mapped_column(String(300))
    source: Mapped[str] = mapped_column(String(10))  # upload | job
    dataset_id: Mapped[str | None] = mapped_column(String(40))
    job_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    produced_by_job_id: Mapped[str | None] = mapped_column(String(40))
    dp: Mapped[bool] = mapped_column(Boolean, default=False)
    job_epsilon: Mapped[float | None] = mapped_column(Float)
    delta: Mapped[float | None] = mapped_column(Float)
    rng: Mapped[str | None] = mapped_column(String(20))
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state_heartbeat", "state", "heartbeat_at"),
                      Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    type: Mapped[str] = mapped_column(String(20))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(20))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    # Attempts ended by a graceful worker shutdown; attempt - drained_attempts were lost.
    drained_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    dataset_id: Mapped[str | None] = mapped_column(String(40))
    model_id: Mapped[str | None] = mapped_column(String(40))  # base model / model sampled
    progress_step: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    epsilon_so_far: Mapped[float | None] = mapped_column(Float)
    eta_s: Mapped[float | None] = mapped_column(Float)
    progress_message: Mapped[str | None] = mapped_column(String(200))
    reservation_id: Mapped[str | None] = mapped_column(String(40))
    privacy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(_TS)
    error_code: Mapped[str | None] = mapped_column(String(60))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(_TS)
    finished_at: Mapped[datetime | None] = mapped_column(_TS)


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(20))
    object_key: Mapped[str] = mapped_column(String(300))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    owner_only: Mapped[bool] = mapped_column(Boolean, default=False)
    non_dp: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    model_id: Mapped[str | None] = mapped_column(String(40))
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)


class IdempotencyKey(Base):
    """The first request made with a client's ``Idempotency-Key`` and, once done, its response.

    Keyed by (tenant, key): two tenants choosing the same key string never meet. ``state`` is
    ``in_progress`` while the first request runs (a duplicate then gets a 409) and ``done``
    once its response is stored (a replay gets that response). See dpsynth_api/idempotency.py.
    """

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(String(500))
    fingerprint: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(12))
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_headers: Mapped[list[list[str]] | None] = mapped_column(JSON, nullable=True)
    response_body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(_TS, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(_TS, index=True)
