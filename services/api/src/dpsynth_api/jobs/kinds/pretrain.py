"""Admitting a ``pretrain`` job: training without differential privacy, on PUBLIC data only.

Pretraining is content-addressed (issue 18, item 5): its key is the sha256 of the spec's
settings (without its name and the reuse flag) and of the data it reads (the dataset's
content hash and its derivation, never its id). When the tenant already has a SUCCEEDED
pretrain of the same key whose model still exists, the submission answers with that job
(200) and nothing runs again; ``reuse: false`` always trains.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dpsynth_shared.dp_events import canonical_json
from dpsynth_shared.job_specs import PretrainSpec
from dpsynth_shared.job_states import JobState
from sqlalchemy import select

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import (
    Admission,
    AdmitContext,
    require_masks_for_target,
    require_visibility,
)
from dpsynth_api.tables import Dataset, Job, Model

_PUBLIC_ONLY = ("pretrain jobs train without differential privacy, so they only accept PUBLIC "
                "datasets; use a finetune job for private data")


def admit(ctx: AdmitContext, spec: PretrainSpec) -> Admission:
    """The public dataset a pretrain job trains on.

    An ``initialise_only`` pretrain reads no dataset (its class names are in the spec).

    Raises:
        DpsynthError: 404, 410 ``dataset_deleted``, 422 ``visibility_mismatch`` /
            ``invalid_spec`` (target 'masks' on a dataset without masks).
    """
    if spec.initialise_only:
        return _reusable(ctx, spec, None, Admission())
    assert spec.dataset_id is not None  # the spec's validator: a dataset unless initialise_only
    dataset = get_dataset(ctx.session, principal=ctx.principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    require_visibility(dataset, "public", "pretrain", _PUBLIC_ONLY)
    require_masks_for_target(dataset, spec.target)
    return _reusable(ctx, spec, dataset, Admission(dataset=dataset))


def reuse_key(spec: PretrainSpec, dataset: Dataset | None) -> str:
    """The content address of a pretraining: its settings and the data it reads."""
    settings = spec.model_dump(mode="json", exclude={"name", "reuse", "dataset_id"})
    data: dict[str, Any] | None = None
    if dataset is not None:
        data = {"sha256": dataset.sha256, "derivation": dataset.derivation,
                "holdout_sha256": dataset.holdout_sha256}
    return hashlib.sha256(canonical_json({"settings": settings, "data": data})).hexdigest()


def _reusable(ctx: AdmitContext, spec: PretrainSpec, dataset: Dataset | None,
              admission: Admission) -> Admission:
    """Record the job's key in its result; point at an identical succeeded job if any."""
    key = reuse_key(spec, dataset)
    admission.result = {**admission.result, "reuse_key": key}
    if not spec.reuse:
        return admission
    rows = ctx.session.scalars(
        select(Job).where(Job.tenant_id == ctx.principal.tenant_id, Job.type == "pretrain",
                          Job.state == str(JobState.SUCCEEDED))
        .order_by(Job.created_at.desc())).all()
    for job in rows:
        result = job.result or {}
        if result.get("reuse_key") != key or not result.get("model_id"):
            continue
        model = ctx.session.get(Model, result["model_id"])
        if model is not None and model.tenant_id == ctx.principal.tenant_id:
            admission.reuse_of = job
            break
    return admission
