"""The audit a finetune job's view shows (issue 19, item 2): the latest succeeded ``audit``
job of the tenant that audited this job or another of the same recipe family (trainable
set, noise multiplicity, micro-batching: :func:`dpsynth_shared.audit_specs.recipe_family`),
with its verdict, date, engine, device and code version; or "not audited". A DP model's
view shows that of the finetune which produced it, and an evaluate claim carries that of
the finetune behind the evaluated corpus's model (its report shows it as of the claim).

Audits cost compute only and run on demand (``POST /v1/jobs`` with ``type: audit``); this
only reads their stored results (docs/privacy.md, "The `audit` job").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dpsynth_shared import __version__
from dpsynth_shared.audit_specs import AuditSummary as AuditSummary  # the views' shape
from dpsynth_shared.audit_specs import recipe_family
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.tables import Job, Model

SCANNED = 200
"""The tenant's most recent succeeded audits searched for a match (newest first)."""


def family_of(spec: dict[str, Any]) -> str:
    """A finetune spec's recipe family (the stored spec has every default filled in)."""
    training = spec.get("training") or {}
    return recipe_family(trainable=str(training.get("trainable", "full")),
                         noise_multiplicity=int(training.get("noise_multiplicity") or 1),
                         max_physical_batch_size=training.get("max_physical_batch_size"))


def _recent_audits(session: Session, tenant_id: str) -> list[Job]:
    """The tenant's ``SCANNED`` most recent succeeded audits, newest first (one query)."""
    return list(session.scalars(
        select(Job).where(Job.tenant_id == tenant_id, Job.type == JobType.AUDIT,
                          Job.state == JobState.SUCCEEDED)
        .order_by(Job.finished_at.desc(), Job.id).limit(SCANNED)))


def _match(audits: Iterable[Job], job: Job) -> AuditSummary:
    """The audit shown for ``job``: of the tenant's ``audits`` (newest first) that audited
    ``job`` or its recipe family, the newest whose key also matches (the device kind and the
    ranks the finetune ran on, this code version), else the newest of them, marked
    ``key_matches: false`` so the view says what differs."""
    family = family_of(job.spec or {})
    device = (job.result or {}).get("device")
    ranks = (job.result or {}).get("world_size")
    candidates = []
    for audit in audits:
        result = audit.result or {}
        key = (result.get("audit_result") or {}).get("key") or {}
        audited = (result.get("audit") or {}).get("audited_job_id")
        if audited == job.id or key.get("recipe_family") == family:
            matches = (key.get("code_version") == __version__
                       and (device is None or key.get("device") == device)
                       and (ranks is None or key.get("world_size", 1) == ranks))
            candidates.append((audit, audited, key, matches))
    if not candidates:
        return AuditSummary(status="not_audited", recipe_family=family,
                            finetune_device=device, finetune_world_size=ranks)
    audit, audited, key, matches = next((c for c in candidates if c[3]), candidates[0])
    view = (audit.result or {}).get("audit_result") or {}
    return AuditSummary(
        status="audited", recipe_family=family, audit_job_id=audit.id, mode=view.get("mode"),
        audited_job_id=audited, same_job=audited == job.id, verdict=view.get("verdict"),
        epsilon_lower_bound=view.get("epsilon_lower_bound"),
        claimed_epsilon=view.get("claimed_epsilon"),
        max_certifiable_epsilon=view.get("max_certifiable_epsilon"),
        engine=key.get("engine"), device=key.get("device"),
        world_size=key.get("world_size"),
        code_version=key.get("code_version"), finished_at=audit.finished_at,
        key_matches=matches, finetune_device=device, finetune_world_size=ranks)


def latest_audit(session: Session, job: Job) -> AuditSummary | None:
    """The audit shown on ``job``'s view (None: not a finetune job)."""
    if job.type != JobType.FINETUNE:
        return None
    return _match(_recent_audits(session, job.tenant_id), job)


def model_audits(session: Session, models: Sequence[Model]) -> dict[str, AuditSummary]:
    """The audit of the finetune that produced each DP model, by model id; a model that no
    finetune produced (an upload, a public pretrain, a feature network) has none.

    A page of models costs two queries whatever its length (the producing jobs, then each
    tenant's recent audits), not one per model."""
    producers = {m.produced_by_job_id for m in models if m.dp and m.produced_by_job_id}
    if not producers:
        return {}
    jobs = {job.id: job for job in session.scalars(
        select(Job).where(Job.id.in_(producers), Job.type == JobType.FINETUNE))}
    audits = {tenant: _recent_audits(session, tenant)
              for tenant in {job.tenant_id for job in jobs.values()}}
    out: dict[str, AuditSummary] = {}
    for model in models:
        job = jobs.get(model.produced_by_job_id or "")
        if model.dp and job is not None and job.tenant_id == model.tenant_id:
            out[model.id] = _match(audits[job.tenant_id], job)
    return out


def model_audit(session: Session, model: Model) -> AuditSummary | None:
    """The audit a DP model's view shows: that of the finetune which produced it (None:
    not a DP model of a finetune)."""
    return model_audits(session, [model]).get(model.id)
