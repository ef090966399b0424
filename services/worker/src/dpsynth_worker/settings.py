"""Typed worker settings (env prefix ``DPSYNTH_WORKER_``, nested delimiter ``__``).

Read once at process start (:func:`load_settings`) and injected; nothing reads the
environment at import time. See ``docs/architecture.md`` ("Settings").
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dpsynth_shared.grants import check_public_keys, public_keys_of
from dpsynth_shared.settings import ObjectStoreSettings, ServiceEndpoint
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerSettings(BaseSettings):
    """Everything a worker process needs, from ``DPSYNTH_WORKER_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="DPSYNTH_WORKER_", env_nested_delimiter="__",
                                      extra="ignore")

    broker_url: str = Field(description="Redis URL of the Celery broker")
    api: ServiceEndpoint = Field(description="the api's base URL and its WORKER_TOKEN")
    ledger: ServiceEndpoint = Field(description="the ledger's base URL and a service token")
    object_store: ObjectStoreSettings = ObjectStoreSettings()
    grant_public_key: str = Field("", description="the ledger's Ed25519 public key (base64)")
    grant_retired_public_keys: list[str] = Field(
        default_factory=list, description="JSON list of further grant public keys accepted "
        "during a grant-key rollover (the previous key; see docs/deploy.md)")
    work_dir: Path = Path("./.dpsynth/work")
    log_level: str = "INFO"
    metrics_port: int | None = Field(None, ge=1, le=65535)
    worker_id: str = Field(default_factory=_default_worker_id)
    queue: str = "dpsynth"
    lease_ttl_s: int = Field(60, ge=1, description="the ledger's lease TTL; the broker's "
                             "visibility timeout is twice this")
    claim_patience_s: float = Field(
        60.0, gt=0, description="how long a claim waits for an unreachable api (connection "
        "refused, 502/503/504) before the task's message goes back to the queue, unacked "
        "(issue 14, item 2); keep it below the broker's visibility timeout (2 x lease_ttl_s) "
        "so the message is not redelivered meanwhile (harmless: claims are fenced)")
    torch_threads: int | None = Field(None, ge=1)
    devices: str = Field(
        "auto", description="where DP finetunes train: auto (every visible GPU, else the "
        "CPU), cpu, cuda, cuda:all or a list such as cuda:0,cuda:1 (one rank per device, "
        "docs/multi-gpu.md); other training runs on the CPU")
    inception_weights: Path | None = Field(
        None, description="pytorch-fid's InceptionV3 weights file (pt_inception-2015-12-05); "
        "evaluate jobs asking for Inception FID fail with inception_weights_unavailable "
        "without it (its sha256 is checked when loaded)")

    @field_validator("grant_retired_public_keys")
    @classmethod
    def _valid_public_keys(cls, keys: list[str]) -> list[str]:
        return check_public_keys(keys, "DPSYNTH_WORKER_GRANT_RETIRED_PUBLIC_KEYS")

    @property
    def grant_public_keys(self) -> list[str]:
        """Every public key a read grant may be signed with (current first)."""
        return public_keys_of([self.grant_public_key, *self.grant_retired_public_keys])

    @property
    def visibility_timeout_s(self) -> int:
        """Redis visibility timeout: above the lease TTL so live jobs are not redelivered
        while their lease is valid (redeliveries are harmless anyway: claims are fenced)."""
        return 2 * self.lease_ttl_s


def load_settings() -> WorkerSettings:
    """Read the settings from the environment (once, at process start)."""
    return WorkerSettings()
