"""Admitting an ``audit`` job: a white-box one-run audit of a finetune job's DP-SGD (issue 19).

An audit tests the MECHANISM, not the data: the worker rebuilds the audited finetune's
DP-SGD exactly as the ledger accounted it (its reservation's σ, q, steps and expected batch
size; its spec; its base model) and runs it on a PUBLIC stand-in dataset with gradient
canaries. So it reads no private record and charges no budget: no reservation, no ledger
call, and the stand-in must be public (422 ``visibility_mismatch``).

What can be audited (422 ``invalid_spec`` otherwise, saying why): one of the tenant's own
finetune jobs (404 for another tenant's), without a central-image release (its own
Gaussian mechanism), with a reservation and its privacy block. A per-label finetune is
audited on the run of its class with the largest epsilon (the worker picks it from the
reservation). The stand-in has as many classes as the audited job's dataset.

:func:`audit_target` is what a claim carries about the audited job (``internal/lineage.py``):
its settings and its dataset's PUBLIC terms, never that dataset's object key.
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.audit_specs import AuditSpec
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.job_types import JobType
from dpsynth_shared.worker_contract import AuditTarget
from sqlalchemy.orm import Session

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs import repository as jobs_repo
from dpsynth_api.jobs.kinds.base import (
    Admission,
    AdmitContext,
    require_masks_for_target,
    require_visibility,
)
from dpsynth_api.models.service import get_model
from dpsynth_api.tables import Dataset, Job
from dpsynth_api.tenants.security import Principal

_PUBLIC_ONLY = ("an audit must never read private data (it runs the audited job's DP-SGD on "
                "a PUBLIC stand-in and charges nothing): name a public dataset as "
                "stand_in_dataset_id")

CLAIMED_KEYS = ("noise_multiplier", "sample_rate", "steps", "expected_batch_size", "delta",
                "job_epsilon")
"""The audited job's privacy figures an audit tests (copied from its privacy block)."""


def admit(ctx: AdmitContext, spec: AuditSpec) -> Admission:
    """The public stand-in, the audited job's base model and the claim under test.

    Raises:
        DpsynthError: 404 (the audited job, its base model or the stand-in: unknown or
            another tenant's), 410 ``dataset_deleted`` (the stand-in), 422
            ``invalid_spec`` (what cannot be audited) / ``visibility_mismatch``.
    """
    audited = audited_job(ctx.session, ctx.principal.tenant_id, spec.job_id)
    claimed = _claimed(audited)
    trained_on = _audited_dataset(ctx.session, audited)
    stand_in = get_dataset(ctx.session, principal=ctx.principal,
                           dataset_id=spec.stand_in_dataset_id)
    check_not_deleted(stand_in)
    require_visibility(stand_in, "public", "audit", _PUBLIC_ONLY)
    check_stand_in(stand_in, trained_on, audited)
    check_audited_class(spec, audited)
    if spec.mode == "black_box":
        check_black_box(spec, audited, trained_on)
    base = _base_model(ctx.session, ctx.principal, audited)
    block = audit_privacy(audited)
    return Admission(dataset=stand_in, model_id=base, plan=block,
                     # no ledger call: the block says the job charges nothing
                     authorise=lambda _ledger: dict(block),
                     result={"audit": {"audited_job_id": audited.id, "mode": spec.mode,
                                       "claimed": claimed}})


def audited_job(session: Session, tenant_id: str, job_id: str) -> Job:
    """The tenant's finetune job an audit may test.

    Raises:
        DpsynthError: 404 (unknown or another tenant's); 422 ``invalid_spec`` saying why it
            cannot be audited.
    """
    job = jobs_repo.get_for_tenant(session, tenant_id=tenant_id, job_id=job_id)
    if job is None:
        raise NotFound("job", job_id)
    training = (job.spec or {}).get("training") or {}
    why = None
    if job.type != JobType.FINETUNE:
        why = (f"it is a {job.type} job: an audit tests the DP-SGD of a finetune job (the "
               "only kind that trains on private data with DP)")
    elif training.get("central_images"):
        why = ("it has training.central_images: the audit covers DP-SGD; the central-image "
               "release is its own Gaussian mechanism")
    elif not job.reservation_id or not isinstance(job.privacy, dict):
        why = ("it has no reservation and privacy block: the audit runs the settings the "
               "ledger accounted, and there are none")
    elif (job.privacy.get("noise_multiplier") is None
          or job.privacy.get("sample_rate") is None) and not job.privacy.get("per_label"):
        why = "its privacy block has no noise multiplier and sample rate to audit"
    if why is not None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {job.id} cannot be audited: {why}",
                           job_id=job.id, job_type=job.type)
    return job


def _claimed(job: Job) -> dict[str, Any]:
    privacy = job.privacy or {}
    claimed = {key: privacy.get(key) for key in CLAIMED_KEYS}
    if privacy.get("per_label"):  # each class's run (σ_c, q_c, steps_c, ε_c)
        claimed["per_label"] = privacy["per_label"]
    return claimed


def _audited_dataset(session: Session, job: Job) -> Dataset:
    """The audited job's dataset row (its public terms only; never read)."""
    dataset = session.get(Dataset, job.dataset_id) if job.dataset_id else None
    if dataset is None or dataset.tenant_id != job.tenant_id:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {job.id} cannot be audited: its "
                           "dataset is gone", job_id=job.id)
    return dataset


def _base_model(session: Session, principal: Principal, job: Job) -> str:
    """The audited job's base model (the audit starts from it): still the tenant's (404)."""
    if job.model_id is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {job.id} cannot be audited: it "
                           "names no base model", job_id=job.id)
    return get_model(session, principal=principal, model_id=job.model_id).id


def check_stand_in(stand_in: Dataset, trained_on: Dataset, audited: Job) -> None:
    """The stand-in replaces the audited dataset's records: as many classes (the class
    table's size is part of the model the audit trains), and masks for a layout generator.

    Raises:
        DpsynthError: 422 ``invalid_spec`` naming both counts.
    """
    have, want = len(stand_in.class_names or []), len(trained_on.class_names or [])
    if have != want:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"the stand-in dataset {stand_in.id} has {have} classes and the "
                           f"audited job's dataset {trained_on.id} has {want}: the stand-in "
                           "must have as many classes", stand_in_classes=have,
                           audited_classes=want)
    target = str(((audited.spec or {}).get("training") or {}).get("target") or "images")
    require_masks_for_target(stand_in, target)


def check_audited_class(spec: AuditSpec, audited: Job) -> None:
    """``audited_class`` names one of a per-label finetune's class runs (its reservation's
    partitions); a whole-dataset finetune has one run and takes none.

    Raises:
        DpsynthError: 422 ``invalid_spec`` naming the classes there are.
    """
    if spec.audited_class is None:
        return
    classes = sorted((audited.privacy or {}).get("per_label") or {})
    if not classes:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {audited.id} is a whole-dataset "
                           "finetune: audited_class is for per-label finetunes",
                           job_id=audited.id, field="audited_class")
    if spec.audited_class not in classes:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {audited.id} has no per-label run "
                           f"of class {spec.audited_class!r}", job_id=audited.id,
                           field="audited_class", classes=classes)


def check_black_box(spec: AuditSpec, audited: Job, trained_on: Dataset) -> None:
    """A black-box audit's canaries are privacy units of the audited run: records, or
    whole subjects of a subject-level run (its unit; each then holds
    ``max_images_per_subject`` images). They are at most half of its N̂ (in that unit; per
    label: of the smallest class's N̂_c). Layout models are covered (each canary carries
    a random layout mask of its own, ``dpsynth_ml.audit.canary_sets``).

    Raises:
        DpsynthError: 422 ``invalid_spec`` saying why.
    """
    privacy = audited.privacy or {}
    runs = list((privacy.get("per_label") or {}).values()) or [privacy]
    populations = [round(float(r["expected_batch_size"]) / float(r["sample_rate"]))
                   for r in runs if r.get("expected_batch_size") and r.get("sample_rate")]
    unit = "subjects" if trained_on.privacy_unit == "subject" else "records"
    why = None
    if not populations or spec.canaries > min(populations) // 2:
        limit = min(populations) // 2 if populations else 0
        why = (f"a black-box audit's canaries are {unit} of the audited run, at most half "
               f"its N̂ {unit}: at most {limit} canaries here")
    if why is not None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"job {audited.id} cannot be audited "
                           f"black-box: {why}", job_id=audited.id, field="canaries")


def audit_privacy(audited: Job) -> dict[str, Any]:
    """An audit job's privacy block (shown by ``dry_run`` and on the job)."""
    return {"epsilon_charged": 0.0, "reads_private_data": False,
            "audited_job_id": audited.id, "audited_reservation_id": audited.reservation_id,
            "notes": ["no epsilon is charged and no private data is read: the audit runs the "
                      "audited job's DP-SGD settings on a public stand-in",
                      "it measures a lower bound on the epsilon of the mechanism as run; "
                      "the claim it tests is the audited job's job_epsilon"]}


def audit_target(session: Session, job: Job) -> AuditTarget:
    """What an audit claim carries about the audited job, checked again at claim time: the
    stand-in (the job's dataset) is public and the audited job is the same tenant's
    finetune. The audited dataset's object key is never included.

    Raises:
        DpsynthError: 422 ``visibility_mismatch`` (a stand-in that is not public), 404 /
            422 ``invalid_spec`` (the audited job).
    """
    stand_in = session.get(Dataset, job.dataset_id) if job.dataset_id else None
    if stand_in is None or stand_in.tenant_id != job.tenant_id:
        raise NotFound("dataset", str(job.dataset_id))
    require_visibility(stand_in, "public", "audit", _PUBLIC_ONLY)
    audited = audited_job(session, job.tenant_id, str((job.spec or {}).get("job_id")))
    assert audited.reservation_id is not None  # audited_job refuses a job without one
    dataset = _audited_dataset(session, audited)
    return AuditTarget(job_id=audited.id, spec=dict(audited.spec or {}),
                       reservation_id=audited.reservation_id, dataset_id=dataset.id,
                       class_names=list(dataset.class_names or []),
                       declared_size=dataset.declared_size, delta=dataset.delta,
                       epsilon_limit=dataset.epsilon_limit,
                       privacy_unit="subject" if dataset.privacy_unit == "subject"
                       else "image")
