"""The ledger's settings: env prefix ``DPSYNTH_LEDGER_``, nested with ``__``; read once."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dpsynth_shared.grants import check_public_keys, public_key_of
from dpsynth_shared.settings import DatabaseSettings, require_strong_secret
from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class AnchorSettings(BaseModel):
    """Where every signed entry is anchored outside the database (``DPSYNTH_LEDGER_ANCHOR__*``).

    ``file`` (the default, embedded mode): an append-only JSON Lines file at ``path``, which
    must live outside the database's data directory (a restored backup must not rewind it).
    ``s3``: one object per record under ``s3_prefix`` in ``s3_bucket``; production needs a
    bucket with versioning and object lock, and no delete permission for these credentials.
    """

    kind: Literal["file", "s3"] = "file"
    path: str = Field("./.dpsynth/ledger-anchor.jsonl", description="file: the log's path")
    s3_endpoint: str = ""
    s3_access_key: SecretStr = SecretStr("")
    s3_secret_key: SecretStr = SecretStr("")
    s3_secure: bool = False
    s3_region: str = "us-east-1"
    s3_bucket: str = "dpsynth-ledger-anchor"
    s3_prefix: str = "ledger-anchor/"


class LedgerSettings(BaseSettings):
    """Typed configuration of the ledger process (fails fast on missing or weak secrets)."""

    model_config = SettingsConfigDict(env_prefix="DPSYNTH_LEDGER_", env_nested_delimiter="__",
                                      extra="ignore")

    database: DatabaseSettings
    service_tokens: list[SecretStr] = Field(min_length=1)
    grant_signing_key: SecretStr
    chain_signing_key: SecretStr = Field(description="Ed25519 key that signs every chain "
                                         "entry (separate from the grant key)")
    chain_retired_public_keys: list[str] = Field(
        default_factory=list, description="JSON list of the public halves of earlier chain "
        "keys: entries and anchor records signed before a chain-key rotation verify with them")
    anchor: AnchorSettings = Field(default_factory=AnchorSettings)
    lease_ttl_s: int = Field(60, ge=1)
    host: str = "127.0.0.1"
    port: int = 8100
    log_level: str = "INFO"
    migrations_dir: Path | None = None
    pld_discretization: float = Field(1e-3, gt=0, le=0.1)
    db_wait_s: float = Field(30.0, ge=0)
    metrics_max_datasets: int = Field(100, ge=0, description="datasets with per-dataset "
                                      "budget gauges (highest spent fraction first)")
    metrics_per_dataset: bool = Field(False, description="export the per-dataset budget "
                                      "gauges (labelled with every tenant's dataset ids); off: "
                                      "only the aggregates")
    metrics_token: SecretStr | None = Field(None, description="bearer token a scrape of "
                                            "/metrics must present (unset: /metrics is open)")

    @field_validator("service_tokens")
    @classmethod
    def _strong_tokens(cls, tokens: list[SecretStr]) -> list[SecretStr]:
        return [require_strong_secret(t, "DPSYNTH_LEDGER_SERVICE_TOKENS") for t in tokens]

    @field_validator("metrics_token")
    @classmethod
    def _strong_metrics_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is None:
            return None
        return require_strong_secret(token, "DPSYNTH_LEDGER_METRICS_TOKEN")

    @field_validator("grant_signing_key", "chain_signing_key")
    @classmethod
    def _valid_key(cls, key: SecretStr, info: ValidationInfo) -> SecretStr:
        try:
            public_key_of(key.get_secret_value())
        except (ValueError, TypeError) as exc:
            name = f"DPSYNTH_LEDGER_{str(info.field_name).upper()}"
            raise ValueError(f"{name} must be an Ed25519 private key "
                             "(dpsynth_shared.grants.generate_signing_key)") from exc
        return key

    @field_validator("chain_retired_public_keys")
    @classmethod
    def _valid_public_keys(cls, keys: list[str]) -> list[str]:
        return check_public_keys(keys, "DPSYNTH_LEDGER_CHAIN_RETIRED_PUBLIC_KEYS")

    @property
    def grant_public_key(self) -> str:
        """The public half of the signing key (what the object store verifies with)."""
        return public_key_of(self.grant_signing_key.get_secret_value())

    @property
    def chain_public_key(self) -> str:
        """The public half of the chain key (what verifies entry and anchor signatures)."""
        return public_key_of(self.chain_signing_key.get_secret_value())
