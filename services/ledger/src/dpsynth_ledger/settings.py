"""The ledger's settings: env prefix ``DPSYNTH_LEDGER_``, nested with ``__``; read once."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dpsynth_shared.grants import check_public_keys, public_key_of
from dpsynth_shared.instance_proof import PROOF_SETTING_HELP
from dpsynth_shared.plan_limits import PlanLimits
from dpsynth_shared.settings import DatabaseSettings, require_strong_secret
from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator
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
    admin_tokens: list[SecretStr] = Field(
        default_factory=list, description="the service tokens that may call /v1/admin/* "
        "(reconciliation across every tenant's budgets): the api's; each must also be in "
        "service_tokens. Empty: every service token may (a warning at start), as before")
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
    pld_discretization: float = Field(1e-3, ge=1e-4, le=0.1, description="PLD value "
                                      "interval: the grid of every PLD is ~range/interval "
                                      "points, so it is bounded below")
    plan_limits: PlanLimits = Field(default_factory=PlanLimits, description="bounds on the "
                                    "accounting one plan may cause (422 plan_too_large)")
    heavy_concurrency: int = Field(2, ge=1, description="heavy computations (calibrations "
                                   "of new shapes, dry-run tight figures, recompute reports) "
                                   "run at once; beyond: 503 ledger_busy with Retry-After")
    heavy_wait_s: float = Field(60.0, ge=0, description="how long a heavy request waits "
                                "for a free slot before it is answered 503 ledger_busy")
    heavy_queue: int = Field(32, ge=0, description="heavy requests that may wait for a slot "
                             "at once (beyond: 503 ledger_busy at once)")
    threads: int = Field(100, ge=8, description="the server's worker threads (every route "
                         "is synchronous); heavy work holds at most heavy_concurrency + "
                         "heavy_queue of them")
    max_tight_composition: int = Field(256, ge=1, description="distinct runs a dry run's "
                                       "tight figure may compose on the request path (beyond: "
                                       "the plan's dataset_tight_epsilon_after is None)")
    tight_poll_s: float = Field(1.0, gt=0, description="how often the background worker "
                                "looks for charging events without a tight figure")
    tight_inline: bool = Field(False, description="compute a missing tight figure in the "
                               "request that reads it (tests only: it puts the PLD back on "
                               "the request path)")
    db_wait_s: float = Field(30.0, ge=0)
    metrics_max_datasets: int = Field(100, ge=0, description="datasets with per-dataset "
                                      "budget gauges (highest spent fraction first)")
    metrics_per_dataset: bool = Field(False, description="export the per-dataset budget "
                                      "gauges (labelled with every tenant's dataset ids); off: "
                                      "only the aggregates")
    metrics_token: SecretStr | None = Field(None, description="bearer token a scrape of "
                                            "/metrics must present (unset: /metrics is open)")
    instance_secret: SecretStr | None = Field(None, description=PROOF_SETTING_HELP)

    @field_validator("service_tokens")
    @classmethod
    def _strong_tokens(cls, tokens: list[SecretStr]) -> list[SecretStr]:
        return [require_strong_secret(t, "DPSYNTH_LEDGER_SERVICE_TOKENS") for t in tokens]

    @model_validator(mode="after")
    def _admin_tokens_are_service_tokens(self) -> LedgerSettings:
        accepted = {t.get_secret_value() for t in self.service_tokens}
        if any(t.get_secret_value() not in accepted for t in self.admin_tokens):
            raise ValueError("every DPSYNTH_LEDGER_ADMIN_TOKENS entry must also be one of "
                             "DPSYNTH_LEDGER_SERVICE_TOKENS")
        return self

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
