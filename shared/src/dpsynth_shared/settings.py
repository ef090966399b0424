"""Settings blocks shared by the services.

Each service composes these into its own ``pydantic_settings.BaseSettings`` with one env
prefix (``DPSYNTH_API_``, ``DPSYNTH_LEDGER_``, ``DPSYNTH_WORKER_``) and ``__`` as the nested
delimiter, e.g. ``DPSYNTH_API_OBJECT_STORE__KIND=s3``. Settings are read once at process
start and injected; nothing here is read at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

_WEAK_SECRETS = {"", "changeme", "changethis", "secret", "password"}


def require_strong_secret(value: SecretStr, name: str) -> SecretStr:
    """Fail fast on empty or well-known default secrets."""
    raw = value.get_secret_value()
    if raw.lower() in _WEAK_SECRETS or len(raw) < 16:
        raise ValueError(f"{name} must be set to a strong secret (>= 16 characters)")
    return value


class DatabaseSettings(BaseModel):
    url: str = Field(description="SQLAlchemy URL, e.g. postgresql+psycopg://u:p@host:5432/db")
    pool_size: int = 5
    max_overflow: int = Field(30, ge=0, description="connections beyond pool_size under load "
                              "(closed when returned); pool_size + max_overflow should cover "
                              "the server's worker threads (40 for FastAPI's sync routes)")
    pool_timeout_s: float = Field(10.0, gt=0, description="wait for a free connection before "
                                  "answering 503 service_unavailable")
    echo: bool = False


class ObjectStoreSettings(BaseModel):
    """Where datasets, models, checkpoints and corpora live."""

    kind: Literal["local", "s3"] = "local"
    root: str = Field("./.dpsynth/objects", description="local store: the folder")
    endpoint: str = Field("", description="s3: host:port of the S3 API")
    public_endpoint: str = Field("", description="s3: host:port presigned URLs are signed for")
    access_key: SecretStr = SecretStr("")
    secret_key: SecretStr = SecretStr("")
    secure: bool = False
    region: str = "us-east-1"
    bucket: str = "dpsynth"
    presign_ttl_s: int = Field(300, ge=1, le=3600)


class ServiceEndpoint(BaseModel):
    """Another service's base URL and the bearer token this service presents to it."""

    url: str
    token: SecretStr

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.rstrip("/")
