"""Bodies of the model endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dpsynth_shared.audit_specs import AuditSummary
from dpsynth_shared.ledger_contract import LINEAGE_LABEL
from dpsynth_shared.text import Name
from pydantic import BaseModel, ConfigDict, Field

from dpsynth_api.tables import Model


class ModelMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=200)


class ModelOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_id: str
    tenant_id: str
    name: str
    source: str = Field(description="upload | job")
    dataset_id: str | None = Field(None, description="lineage: the dataset trained on last")
    job_ids: list[str] = Field(default_factory=list,
                               description="lineage: jobs incl. DP ancestors on the dataset")
    produced_by_job_id: str | None = None
    dp: bool
    job_epsilon: float | None = None
    job_epsilon_label: str | None = Field(
        None, description="set when job_epsilon composes DP ancestors on the same budget: "
        "then it is a PLD figure valid only had the sequence been fixed in advance, not a "
        "guarantee under adaptive use")
    dataset_epsilon_spent: float | None = Field(
        None, description="the guarantee beside job_epsilon: the dataset's RDP filter figure "
        "when the model's last step was granted (it covers the model, its ancestors and every "
        "earlier charge of the budget); None for a model made before it was recorded")
    delta: float | None = None
    rng: str | None = Field(None, description="'test' when trained with an injected seeded rng")
    publishable: bool
    info: dict[str, Any] = Field(
        default_factory=dict, description="the model's shape, from its dpsynth_model.json or "
        "its training job: preset, space ('latent': autoencoder + latent denoiser; 'pixel': "
        "a denoiser on images up to 64x64, no autoencoder), image_size, channels, "
        "class_names, unet_class, layout_channels, target, ...")
    sha256: str
    size_bytes: int
    created_at: datetime
    audit: AuditSummary | None = Field(
        None, description="a DP model: the latest privacy audit of the finetune job that "
        "produced it or of another finetune of its recipe family, or status 'not_audited' "
        "(docs/privacy.md, empirical audits); null for a model no finetune produced")


class ModelPage(BaseModel):
    items: list[ModelOut]
    next_cursor: str | None = None


def lineage_label(model: Model) -> str | None:
    """``LINEAGE_LABEL`` for a DP model whose ``job_epsilon`` composes DP ancestors (its
    ``job_ids`` hold more than its own job: docs/privacy.md, "Figures that are not a
    guarantee"), else None."""
    return LINEAGE_LABEL if model.dp and len(model.job_ids or []) > 1 else None


def _spent(model: Model) -> float | None:
    value = (model.info or {}).get("dataset_epsilon_spent") if model.dp else None
    return float(value) if isinstance(value, int | float) else None


def model_out(model: Model, audit: AuditSummary | None = None) -> ModelOut:
    """The view of a model row (with ``audit``, its producing finetune's audit); a model
    stamped ``rng: test`` is never publishable."""
    return ModelOut(
        model_id=model.id, tenant_id=model.tenant_id, name=model.name, source=model.source,
        dataset_id=model.dataset_id, job_ids=list(model.job_ids or []),
        produced_by_job_id=model.produced_by_job_id, dp=model.dp, job_epsilon=model.job_epsilon,
        job_epsilon_label=lineage_label(model), dataset_epsilon_spent=_spent(model),
        delta=model.delta, rng=model.rng, publishable=model.rng != "test", info=model.info or {},
        sha256=model.sha256, size_bytes=model.size_bytes, created_at=model.created_at,
        audit=audit)
