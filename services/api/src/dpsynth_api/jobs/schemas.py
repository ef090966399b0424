"""Bodies of the job endpoints. Nothing here is ever computed from private data: progress is
step / total / epsilon / ETA, and worker results pass an allow-list (:data:`RESULT_KEYS`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import TIGHT_LABEL, Plan
from pydantic import BaseModel, ConfigDict, Field

from dpsynth_api.jobs.audits import AuditSummary
from dpsynth_api.tables import Artifact, Job

# Keys of a worker's result that may enter the job record (data-independent only).
RESULT_KEYS = frozenset({"job_epsilon", "job_epsilon_granted", "steps", "steps_done",
                         "samples", "model_id", "checkpoint_step", "seed", "images",
                         "images_per_second", "sampler", "guidance_scale", "batch_size",
                         "steps_used", "trainable_parameters",
                         # a finetune's model: the label of a composed job_epsilon and the
                         # filter figure beside it (issue 13, item 8)
                         "job_epsilon_label", "dataset_epsilon_spent",
                         # the device kind and ranks a DP training ran on: its audits are
                         # keyed by them (jobs/audits.py; issue 19)
                         "device", "world_size"})
# An evaluate job's result: ONLY where its report is and how it is labelled, never a
# metric (a reader without the owner scope sees job results; the headline numbers are served
# by GET /v1/jobs/{id}/report, owner-only for a private reference).
EVALUATE_RESULT_KEYS = frozenset({"report_artifact_id", "report_html_artifact_id", "non_dp",
                                  "contains_private_images",
                                  # the DP release of an evaluate job with dp (issue 13,
                                  # item 6): noised, charged to the held-out partition
                                  "dp_evaluation"})
# Keys the api itself writes into a job's result at submission; a worker never sets them.
API_RESULT_KEYS = frozenset({"layout_source",
                             # a pretrain's content address (issue 18, item 5)
                             "reuse_key",
                             # an audit's audited job and the claim it tests
                             # (jobs/kinds/audit.py; issue 19)
                             "audit"})


# A feature_net job trains on PUBLIC data only: its accuracy on public validation records
# is no statistic of private data.
FEATURE_NET_RESULT_KEYS = RESULT_KEYS | {"accuracy", "validation_size", "model_hash"}


# An audit job's result: its measured bounds, the claim it tested and what ran, all on a
# PUBLIC stand-in (it reads no private record); no model is kept.
AUDIT_RESULT_KEYS = frozenset({"audit_result"})


def result_keys(job_type: str) -> frozenset[str]:
    """The result keys a worker may set (and a reader sees) for a job of this type."""
    if job_type == "evaluate":
        return EVALUATE_RESULT_KEYS
    if job_type == "audit":
        return AUDIT_RESULT_KEYS
    return FEATURE_NET_RESULT_KEYS if job_type == "feature_net" else RESULT_KEYS


class Progress(BaseModel):
    step: int = 0
    total: int = 0
    epsilon_so_far: float | None = None
    eta_s: float | None = None
    message: str | None = None


class JobError(BaseModel):
    code: str
    message: str | None = None


class ArtifactRef(BaseModel):
    artifact_id: str
    kind: str
    owner_only: bool
    non_dp: bool


class JobOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    job_id: str
    name: str | None = Field(None, description="the spec's optional `name`")
    tenant_id: str
    type: str
    state: JobState
    attempt: int
    drained_attempts: int = Field(0, description="attempts ended by a graceful worker "
                                  "shutdown; they do not count towards max_attempts")
    spec: dict[str, Any]
    dataset_id: str | None = None
    model_id: str | None = Field(None, description="base model (finetune) / model (generate)")
    progress: Progress
    privacy: dict[str, Any] | None = Field(None, description="the ledger's plan and figures")
    result: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    error: JobError | None = None
    heartbeat_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    audit: AuditSummary | None = Field(
        None, description="GET /v1/jobs/{id} of a finetune job: the latest privacy audit of "
        "this job or another of its recipe family, or status 'not_audited' (lists: null)")


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = None


class DryRun(BaseModel):
    """What a submission would do; nothing is stored or reserved."""

    dry_run: bool = True
    type: str
    dataset_id: str | None = None
    model_id: str | None = None
    steps: int | None = None
    plan: dict[str, Any] | None = None
    spec: dict[str, Any] = Field(default_factory=dict, description="the validated spec with "
                                 "every default filled in: exactly what would run")
    warnings: list[str] = Field(default_factory=list, description="settings that would run "
                                "but probably not as the user means (e.g. a finetune that "
                                "learns its class table afresh where the base model's "
                                "already fits); nothing is refused")


def privacy_block(plan: Plan, *, reservation_id: str | None, steps: int) -> dict[str, Any]:
    """The labelled privacy figures stored on a job (and shown by ``dry_run``).

    A per-label job has no single noise multiplier or sample rate: ``per_label`` gives each
    class's run (σ_c, q_c, steps_c, expected batch size, declared class size and the class
    model's standalone epsilon); ``job_epsilon`` is the max over classes and ``steps`` the
    sum of the classes' steps.
    """
    event = plan.event
    whole = event if isinstance(event, DpSgdEvent) else None
    return {
        "reservation_id": reservation_id,
        "job_epsilon": plan.job_epsilon,
        "noise_multiplier": whole.noise_multiplier if whole else None,
        "sample_rate": whole.sample_rate if whole else None,
        "steps": steps,
        "expected_batch_size": plan.expected_batch_size,
        "delta": plan.delta,
        "admission_order": plan.admission_order,
        "accountant": plan.accountant,
        "dataset_epsilon_spent_before": plan.dataset_epsilon_spent_before,
        "dataset_epsilon_spent_after": plan.dataset_epsilon_spent_after,
        "dataset_tight_epsilon_after": plan.dataset_tight_epsilon_after,
        "dataset_tight_epsilon_label": plan.dataset_tight_epsilon_label or TIGHT_LABEL,
        "admissible": plan.admissible,
        "max_admissible_target_epsilon": plan.max_admissible_target_epsilon,
        # how the runs enter the budget (single / parallel / sequential per-label) and what
        # the plan assumed in words (group privacy on replace-one datasets, the privacy unit)
        "composition": plan.composition,
        "notes": list(plan.notes),
        **({} if plan.per_label is None else {"per_label": {
            name: {"noise_multiplier": part.event.noise_multiplier,
                   "sample_rate": part.event.sample_rate, "steps": part.event.steps,
                   "expected_batch_size": part.expected_batch_size,
                   "class_size": part.class_size, "job_epsilon": part.job_epsilon,
                   "rdp_total": part.rdp_total}
            for name, part in plan.per_label.items()}}),
        # the central-image release the job makes first (composed into the figures after)
        **({} if plan.central_images is None else {"central_images": {
            "epsilon": plan.central_images.epsilon, "kind": plan.central_images.event.kind,
            "noise_std": plan.central_images.noise_std,
            "rdp_charge": plan.central_images.rdp_charge}}),
    }


def _spec_name(spec: dict[str, Any] | None) -> str | None:
    name = (spec or {}).get("name")
    return name if isinstance(name, str) else None


def job_out(job: Job, artifacts: list[Artifact], *, owner: bool) -> JobOut:
    """The view of a job; owner-only artifacts are listed only for owner keys."""
    error = JobError(code=job.error_code, message=job.error_message) if job.error_code else None
    return JobOut(
        job_id=job.id, name=_spec_name(job.spec), tenant_id=job.tenant_id, type=job.type,
        state=JobState(job.state),
        attempt=job.attempt, drained_attempts=job.drained_attempts, spec=job.spec,
        dataset_id=job.dataset_id, model_id=job.model_id,
        progress=Progress(step=job.progress_step, total=job.progress_total,
                          epsilon_so_far=job.epsilon_so_far, eta_s=job.eta_s,
                          message=job.progress_message),
        privacy=job.privacy, result={k: v for k, v in (job.result or {}).items()
                                     if k in result_keys(job.type) or k in API_RESULT_KEYS},
        artifacts=[ArtifactRef(artifact_id=a.id, kind=a.kind, owner_only=a.owner_only,
                               non_dp=a.non_dp) for a in artifacts if owner or not a.owner_only],
        error=error, heartbeat_at=job.heartbeat_at, created_at=job.created_at,
        updated_at=job.updated_at, started_at=job.started_at, finished_at=job.finished_at)
