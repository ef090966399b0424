"""Typed settings of the api, read once at process start (env prefix ``DPSYNTH_API_``).

Nested blocks use ``__`` (``DPSYNTH_API_DATABASE__URL``, ``DPSYNTH_API_LEDGER__TOKEN``).
Weak or default secrets fail fast at start (full-stack-fastapi-template's habit).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dpsynth_shared.grants import check_public_keys, public_keys_of
from dpsynth_shared.instance_proof import PROOF_SETTING_HELP
from dpsynth_shared.plan_limits import PlanLimits
from dpsynth_shared.settings import (
    DatabaseSettings,
    ObjectStoreSettings,
    ServiceEndpoint,
    require_strong_secret,
)
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dpsynth_api.inflation import (
    DEFAULT_MAX_MEMBER_BYTES,
    DEFAULT_MAX_RATIO,
    DEFAULT_RATIO_FLOOR_BYTES,
    ArchiveLimits,
)

_REPO_MIGRATIONS = Path(__file__).resolve().parents[4] / "migrations" / "api"


class ApiSettings(BaseSettings):
    """Everything the api process needs; injected, never read at import time."""

    model_config = SettingsConfigDict(
        env_prefix="DPSYNTH_API_", env_nested_delimiter="__", extra="ignore"
    )

    database: DatabaseSettings
    broker_url: str = "redis://127.0.0.1:6379/0"
    object_store: ObjectStoreSettings = ObjectStoreSettings()
    ledger: ServiceEndpoint
    ledger_timeout_s: float = Field(120.0, gt=0, description="per-request timeout for the "
                                    "ledger; admission calibrates noise, which takes seconds "
                                    "under concurrent submissions")
    worker_token: SecretStr
    worker_retired_tokens: list[SecretStr] = Field(
        default_factory=list, description="JSON list of further worker tokens still accepted "
        "while workers move to a new WORKER_TOKEN (rotation; see docs/deploy.md)")
    record_hash_key: SecretStr = Field(
        description="HMAC-SHA256 key of the keyed subject hashes (datasets/overlap.py): "
        "required, so low-entropy subject ids (patient numbers) cannot be brute-forced from "
        "a database dump; rotating it breaks overlap detection across uploads")
    metrics_token: SecretStr | None = Field(None, description="bearer token a scrape of "
                                            "/metrics must present (unset: /metrics is open)")
    instance_secret: SecretStr | None = Field(None, description=PROOF_SETTING_HELP)
    lease_ttl_s: int = Field(60, ge=1)
    heartbeat_s: int = Field(10, ge=1)
    max_attempts: int = Field(3, ge=1, description="attempts a job may lose (worker lost, "
                              "no heartbeat) before it fails too_many_attempts; graceful "
                              "drains do not count")
    max_drained_attempts: int = Field(
        50, ge=1, description="graceful worker drains (SIGTERM: rolling deploys, "
        "scale-downs) a job may take before it fails too_many_attempts; a separate, larger "
        "cap than max_attempts so a job cannot be requeued forever")
    plan_limits: PlanLimits = Field(
        default_factory=PlanLimits, description="the ledger's plan bounds, checked at "
        "submission so an out-of-bounds job is refused before the ledger is asked (422 "
        "plan_too_large); keep them equal to DPSYNTH_LEDGER_PLAN_LIMITS__*")
    queued_resend_s: int = Field(
        1800, ge=1, description="the reaper re-sends the task of a job left queued and "
        "unclaimed this long (its message was lost: a broker restart, a send that never "
        "happened), at most once per this period; well above the usual queue wait, since "
        "a duplicate message only costs a refused claim (docs/hardening-jobs.md)")
    max_upload_bytes: int = Field(512 * 1024 * 1024, ge=1)
    max_uncompressed_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=1,
                                        description="cap on the inflated size of an archive")
    max_archive_members: int = Field(200_000, ge=1)
    max_member_bytes: int = Field(
        DEFAULT_MAX_MEMBER_BYTES, ge=1, description="the most bytes one archive member read "
        "into memory may have (an image, a config; model weights are streamed), and the "
        "largest single read from a decompressed stream")
    max_decompression_ratio: float = Field(
        DEFAULT_MAX_RATIO, gt=1, description="the most an upload may inflate relative to its "
        "compressed size (counted while inflating; decompression bombs)")
    ratio_floor_bytes: int = Field(
        DEFAULT_RATIO_FLOOR_BYTES, ge=0, description="inflating up to this many bytes is "
        "allowed whatever the ratio (small, very compressible uploads)")
    spool_dir: Path = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "dpsynth-api-spool",
        description="where uploads are staged while checked (one folder per upload); "
        "the embedded platform puts it under its data folder. Swept of what a crash left")
    sweep_grace_s: float = Field(3600.0, ge=0, description="a staged upload (and the "
                                 "objects it wrote) untouched this long, and not held by a "
                                 "live api, is an orphan the sweeper removes")
    sweep_interval_s: float = Field(600.0, gt=0, description="how often the api sweeps "
                                    "orphans, besides at start")
    sweep_enabled: bool = True
    max_image_pixels: int = Field(16 * 1024 * 1024, ge=1, description="per image")
    bootstrap_credentials_file: Path | None = None
    public_url: str | None = Field(None, description="api_url written to the credentials file")
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "INFO"
    grant_public_key: str | None = None
    grant_retired_public_keys: list[str] = Field(
        default_factory=list, description="JSON list of further grant public keys accepted "
        "during a grant-key rollover (the previous key)")
    reaper_enabled: bool = True
    migrations_dir: Path = _REPO_MIGRATIONS
    # Idempotency-Key (issue 14, item 8; docs/hardening-requests.md)
    idempotency_ttl_s: int = Field(24 * 3600, ge=1, description="how long a stored "
                                   "Idempotency-Key and its response are kept (then purged)")
    idempotency_lock_timeout_s: int = Field(
        900, ge=1, description="a first request still marked in progress after this long "
        "is taken as lost (its api process died) and a retry with its key may run again")
    # Rate limits per API key, shared by the api replicas through Redis (issue 14, item 12)
    rate_limit_enabled: bool = True
    rate_limit_redis_url: str | None = Field(None, description="Redis of the shared token "
                                             "buckets (default: broker_url)")
    rate_limit_requests_per_s: float = Field(300.0, gt=0, description="sustained non-upload "
                                             "requests per second per key")
    rate_limit_requests_burst: int = Field(600, ge=1)
    rate_limit_uploads_per_s: float = Field(2.0, gt=0, description="sustained uploads "
                                            "(multipart POSTs) per second per key")
    rate_limit_uploads_burst: int = Field(120, ge=1)
    rate_limit_upload_bytes_per_s: float = Field(64 * 1024 * 1024, gt=0,
                                                 description="sustained upload bytes per "
                                                 "second per key (by Content-Length)")
    rate_limit_upload_bytes_burst: int = Field(2 * 1024 * 1024 * 1024, ge=1)
    rate_limit_unknown_per_s: float = Field(
        50.0, gt=0, description="requests per second per client address carrying no token or "
        "one not yet accepted (a flood of made-up keys: each is a key lookup and a 401)")
    rate_limit_unknown_burst: int = Field(200, ge=1)

    @field_validator("worker_token")
    @classmethod
    def _strong_worker_token(cls, v: SecretStr) -> SecretStr:
        return require_strong_secret(v, "DPSYNTH_API_WORKER_TOKEN")

    @field_validator("metrics_token")
    @classmethod
    def _strong_metrics_token(cls, v: SecretStr | None) -> SecretStr | None:
        return None if v is None else require_strong_secret(v, "DPSYNTH_API_METRICS_TOKEN")

    @field_validator("worker_retired_tokens")
    @classmethod
    def _strong_retired_tokens(cls, v: list[SecretStr]) -> list[SecretStr]:
        return [require_strong_secret(t, "DPSYNTH_API_WORKER_RETIRED_TOKENS") for t in v]

    @field_validator("grant_retired_public_keys")
    @classmethod
    def _valid_public_keys(cls, keys: list[str]) -> list[str]:
        return check_public_keys(keys, "DPSYNTH_API_GRANT_RETIRED_PUBLIC_KEYS")

    @field_validator("record_hash_key")
    @classmethod
    def _strong_record_hash_key(cls, v: SecretStr) -> SecretStr:
        return require_strong_secret(v, "DPSYNTH_API_RECORD_HASH_KEY")

    @field_validator("ledger")
    @classmethod
    def _strong_ledger_token(cls, v: ServiceEndpoint) -> ServiceEndpoint:
        require_strong_secret(v.token, "DPSYNTH_API_LEDGER__TOKEN")
        return v

    @property
    def worker_tokens(self) -> list[str]:
        """Every token ``/internal/v1`` accepts: WORKER_TOKEN and the retired ones."""
        return [t.get_secret_value() for t in (self.worker_token, *self.worker_retired_tokens)]

    @property
    def grant_public_keys(self) -> list[str]:
        """Every public key a read grant may be signed with (current first)."""
        return public_keys_of([self.grant_public_key or "", *self.grant_retired_public_keys])

    @property
    def archive_limits(self) -> ArchiveLimits:
        """The caps every upload is inflated under (dpsynth_api/inflation.py)."""
        return ArchiveLimits(self.max_uncompressed_bytes, self.max_archive_members,
                             max_member_bytes=self.max_member_bytes,
                             max_ratio=self.max_decompression_ratio,
                             ratio_floor_bytes=self.ratio_floor_bytes)

    @property
    def api_url(self) -> str:
        """The base URL clients use to reach this api."""
        return self.public_url or f"http://{self.host}:{self.port}"
