"""Admitting a ``pretrain`` job: training without differential privacy, on PUBLIC data only."""

from __future__ import annotations

from dpsynth_shared.job_specs import PretrainSpec

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import (
    Admission,
    AdmitContext,
    require_masks_for_target,
    require_visibility,
)

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
        return Admission()
    assert spec.dataset_id is not None  # the spec's validator: a dataset unless initialise_only
    dataset = get_dataset(ctx.session, principal=ctx.principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    require_visibility(dataset, "public", "pretrain", _PUBLIC_ONLY)
    require_masks_for_target(dataset, spec.target)
    return Admission(dataset=dataset)
