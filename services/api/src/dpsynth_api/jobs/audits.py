"""The audit a finetune job's view shows (issue 19, item 2): the latest succeeded ``audit``
job of the tenant that audited this job or another of the same recipe family (trainable
set, noise multiplicity, micro-batching: :func:`dpsynth_shared.audit_specs.recipe_family`),
with its verdict, date, engine, device and code version; or "not audited".

Audits cost compute only and run on demand (``POST /v1/jobs`` with ``type: audit``); this
only reads their stored results (docs/privacy.md, "The `audit` job").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from dpsynth_shared.audit_specs import recipe_family
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.tables import Job

SCANNED = 200
"""The tenant's most recent succeeded audits searched for a match (newest first)."""


class AuditSummary(BaseModel):
    """The latest audit matching a finetune job, or ``not_audited``."""

    status: Literal["audited", "not_audited"]
    recipe_family: str = Field(description="the finetune's recipe family, the match key")
    audit_job_id: str | None = None
    mode: str | None = Field(None, description="white_box / black_box")
    audited_job_id: str | None = Field(None, description="the job whose settings that audit "
                                       "ran: this one, or another of the same family")
    same_job: bool | None = None
    verdict: str | None = Field(None, description="consistent / cannot_bite / rejected / "
                                "unconfirmed (docs/privacy.md)")
    epsilon_lower_bound: float | None = None
    claimed_epsilon: float | None = None
    max_certifiable_epsilon: float | None = None
    engine: str | None = None
    device: str | None = None
    code_version: str | None = None
    finished_at: datetime | None = None


def family_of(spec: dict[str, Any]) -> str:
    """A finetune spec's recipe family (the stored spec has every default filled in)."""
    training = spec.get("training") or {}
    return recipe_family(trainable=str(training.get("trainable", "full")),
                         noise_multiplicity=int(training.get("noise_multiplicity") or 1),
                         max_physical_batch_size=training.get("max_physical_batch_size"))


def latest_audit(session: Session, job: Job) -> AuditSummary | None:
    """The audit shown on ``job``'s view (None: not a finetune job)."""
    if job.type != JobType.FINETUNE:
        return None
    family = family_of(job.spec or {})
    audits = session.scalars(
        select(Job).where(Job.tenant_id == job.tenant_id, Job.type == JobType.AUDIT,
                          Job.state == JobState.SUCCEEDED)
        .order_by(Job.finished_at.desc(), Job.id).limit(SCANNED))
    for audit in audits:
        view = (audit.result or {}).get("audit_result") or {}
        key = view.get("key") or {}
        audited = ((audit.result or {}).get("audit") or {}).get("audited_job_id")
        if audited != job.id and key.get("recipe_family") != family:
            continue
        return AuditSummary(
            status="audited", recipe_family=family, audit_job_id=audit.id,
            mode=view.get("mode"),
            audited_job_id=audited, same_job=audited == job.id, verdict=view.get("verdict"),
            epsilon_lower_bound=view.get("epsilon_lower_bound"),
            claimed_epsilon=view.get("claimed_epsilon"),
            max_certifiable_epsilon=view.get("max_certifiable_epsilon"),
            engine=key.get("engine"), device=key.get("device"),
            code_version=key.get("code_version"), finished_at=audit.finished_at)
    return AuditSummary(status="not_audited", recipe_family=family)
