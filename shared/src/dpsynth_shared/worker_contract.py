"""The api's internal endpoints for workers (``/internal/v1``, worker service token).

Workers never change job state themselves: they claim a job (fenced by its attempt number),
send heartbeats with data-independent progress, register output artifacts and *propose*
transitions; the api applies them through the job state table under a row lock.

Progress carries only data-independent quantities: step, total, epsilon so far, ETA.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpsynth_shared.audit_specs import AuditSummary
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClaimRequest(_Body):
    attempt: int = Field(ge=1)
    worker_id: str


class DatasetInfo(BaseModel):
    dataset_id: str
    visibility: Literal["public", "private"]
    object_key: str
    class_names: list[str]
    declared_size: int | None = None
    delta: float | None = None
    epsilon_limit: float | None = Field(
        None, description="private datasets: the budget's epsilon limit (public); it sizes the "
        "fixed per-step work of DP-SGD so that the timing channel adds at most 1e-3·delta at "
        "any figure the dataset can reach (docs/privacy.md, item 5)")
    has_masks: bool = False
    declared_public_by: str | None = Field(
        None, description="public datasets: the key that declared the data public (recorded "
        "in the manifest of a corpus whose layouts come from it)")
    class_sizes: dict[str, int] | None = Field(
        None, description="public per-class sizes declared at upload (per-label training)")
    privacy_unit: Literal["image", "subject"] = Field(
        "image", description="'subject': user-level DP-SGD (Poisson over subjects, one clipped "
        "contribution per subject); the canonical npz carries a `subjects` array")
    selection: dict[str, Any] | None = Field(
        None, description="a derived dataset: the selection over the parent's object "
        "(object_key is the parent's): {'classes': [class names kept]} and/or {'split': "
        "{'rule': 'keyed_hash_v1', 'key', 'fraction', 'part'}} (dpsynth_shared."
        "record_splits) or, for splits made before issue 13, {'indices_key': <npy of "
        "record indices>}; None: the whole object")
    budget_id: str | None = Field(
        None, description="private datasets: the ledger budget the dataset charges (its own "
        "id, or its parent's for a derived or linked dataset): the reservation, the read "
        "grant and job_epsilon are the budget's")
    holdout_object_key: str | None = Field(
        None, description="the held-out records set aside at upload (holdout_fraction): a "
        "canonical npz under the same prefix as the dataset's object; never trained on, "
        "read only by evaluate jobs (with the same read grant for a private dataset)")
    holdout_size: int | None = Field(None, description="images in the held-out npz")


class ModelRef(BaseModel):
    model_id: str
    object_key: str
    dataset_id: str | None = None
    job_ids: list[str] = Field(default_factory=list)
    dp: bool = False
    budget_id: str | None = Field(
        None, description="a DP model: the ledger budget of the dataset it was trained on; "
        "a finetune on a dataset charging the same budget (the dataset itself, or one derived "
        "from or linked to it) composes the model's DP ancestors")


class CorpusRef(BaseModel):
    """evaluate: the synthetic corpus under evaluation (a generate job's corpus artifact)."""

    artifact_id: str
    object_key: str
    job_id: str = Field(description="the generate job")
    model_id: str | None = Field(None, description="the model the corpus was sampled from")
    dp: bool = False
    budget_id: str | None = Field(None, description="a DP model's budget (its dataset's)")
    audit: AuditSummary | None = Field(
        None, description="a DP model: the latest privacy audit of the finetune that produced "
        "it (or of another of its recipe family) as of the claim, or status 'not_audited'; "
        "None for a model no finetune produced (and in claims made before issue 19)")


class AuditTarget(BaseModel):
    """audit: the audited finetune job, as the worker rebuilds its DP-SGD (never its data)."""

    job_id: str
    spec: dict[str, Any] = Field(description="the audited job's validated finetune spec")
    reservation_id: str = Field(description="the audited job's reservation: σ, q, steps and "
                                "expected batch size exactly as the ledger accounted them")
    dataset_id: str
    class_names: list[str]
    declared_size: int | None = Field(None, description="N̂ of the audited dataset (public)")
    delta: float | None = None
    epsilon_limit: float | None = None
    privacy_unit: Literal["image", "subject"] = "image"


class Claim(BaseModel):
    """Everything a worker needs to run one attempt of a job."""

    job_id: str
    tenant_id: str
    attempt: int
    type: JobType
    spec: dict[str, Any]
    dataset: DatasetInfo | None = None
    base_model: ModelRef | None = None
    reservation_id: str | None = None
    resume_checkpoint_key: str | None = None
    resume_step: int = 0
    layout_dataset: DatasetInfo | None = Field(
        None, description="generate: the PUBLIC dataset whose layout masks condition "
        "sampling (GenerateSpec.layout_source); never a private one")
    layout_model: ModelRef | None = Field(
        None, description="generate: the layout generator (a model trained with target "
        "'masks', public-pretrained or DP-trained) whose sampled masks condition sampling "
        "(GenerateSpec.layout_source.model_id)")
    corpus: CorpusRef | None = Field(None, description="evaluate: the corpus")
    feature_model: ModelRef | None = Field(
        None, description="evaluate: the feature network (EvaluateSpec.feature_model_id); "
        "its public dataset is ``feature_dataset``")
    feature_dataset: DatasetInfo | None = Field(
        None, description="evaluate: the PUBLIC dataset the feature network was trained on "
        "(its validation records re-check the network's accuracy)")
    evaluation_id: str | None = Field(
        None, description="evaluate on a PRIVATE reference: the ledger's evaluation "
        "authorisation; the worker exchanges it for a read grant (a non-DP read recorded in "
        "the ledger's chain, no epsilon charged)")
    dp_evaluation: dict[str, Any] | None = Field(
        None, description="evaluate with dp: the job's DP plan (target_epsilon, metrics, the "
        "PUBLIC held-out size holdout_size, budget_id); the worker releases through the "
        "ledger's held-out partition (issue 13, item 6)")
    holdout_overlap: dict[str, Any] | None = Field(
        None, description="evaluate: the api's check that the reference's held-out records "
        "were not trained on by the corpus's model lineage (status, caveat); a caveat leads "
        "the report's headline (issue 15, item 8)")
    audit_target: AuditTarget | None = Field(
        None, description="audit: the audited finetune job's settings (no object key: an "
        "audit never reads the audited dataset); ``dataset`` is the PUBLIC stand-in")
    lease_ttl_s: int
    heartbeat_s: int


class Heartbeat(_Body):
    attempt: int = Field(ge=1)
    step: int = Field(ge=0)
    total: int = Field(ge=0)
    epsilon_so_far: float | None = None
    eta_s: float | None = None
    message: str | None = Field(None, max_length=200,
                                description="data-independent phase name, e.g. 'sampling'")


class HeartbeatReply(BaseModel):
    cancel_requested: bool
    state: JobState


class RegisterArtifact(_Body):
    attempt: int = Field(ge=1)
    kind: Literal["model", "checkpoint", "corpus", "private_stats", "report"]
    object_key: str
    sha256: str
    size: int
    owner_only: bool = False
    non_dp: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    checkpoint_step: int | None = None


class RegisteredArtifact(BaseModel):
    artifact_id: str
    model_id: str | None = None


class ProposeTransition(_Body):
    attempt: int = Field(ge=1)
    to_state: JobState
    error_code: str | None = None
    message: str | None = Field(None, max_length=2000)
    result: dict[str, Any] = Field(default_factory=dict)
