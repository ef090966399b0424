"""Where a generate job's layout masks come from (DP-DocLDM layout conditioning).

Only PUBLIC masks may condition sampling: a public dataset (such as the synthetic documents
of :mod:`dpsynth_shared.documents`) or masks their uploader declared public (the dataset
records the key that did, ``declared_public_by``). A mask taken from a private dataset would
be copied into a released document: its privacy loss is unbounded, so no charge to the
dataset's budget could cover it, and it is refused with ``private_conditioning_refused``.
(A layout generator trained with DP on the private masks, charged to the dataset, is not
built.)
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import GenerateSpec
from sqlalchemy.orm import Session

from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.models.conditioning import layout_channels
from dpsynth_api.tables import Dataset, Model
from dpsynth_api.tenants.security import Principal


def resolve_layout_source(session: Session, *, principal: Principal, spec: GenerateSpec,
                          model: Model) -> Dataset | None:
    """The public dataset whose masks condition a generate job, or None without layouts.

    Raises:
        DpsynthError: 404 for a dataset the tenant does not have; 422
            ``private_conditioning_refused`` for a private dataset; 422 ``invalid_spec`` for
            a dataset without masks, a layout-conditioned model without ``layout_source``
            or a model without layout conditioning given one.
    """
    channels = layout_channels(model.info or {})
    source = spec.layout_source
    if source is None:
        if channels:
            raise DpsynthError(
                ErrorCode.INVALID_SPEC,
                f"model {model.id} is layout-conditioned ({channels} layout channel(s), "
                "DP-DocLDM): a generate job needs layout_source naming a PUBLIC dataset "
                "with layout masks, e.g. the synthetic documents of `dpsynth datasets "
                "make-documents` uploaded as a public dataset", model_id=model.id)
        return None
    dataset = get_dataset(session, principal=principal, dataset_id=source.dataset_id)
    if dataset.visibility != "public":
        raise DpsynthError(
            ErrorCode.PRIVATE_CONDITIONING_REFUSED,
            f"dataset {dataset.id} is private: its layout masks are private records. A mask "
            "copied from a private record into a generated document has unbounded privacy "
            "loss, so no charge to the dataset's budget could cover it. Take layouts from a "
            "public dataset with masks (e.g. `dpsynth datasets make-documents`), or upload "
            "masks you assert are public as a public dataset (its manifest records who "
            "declared them public)", dataset_id=dataset.id)
    if not dataset.has_masks:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"dataset {dataset.id} carries no layout masks; upload an .npz "
                           "with a 'masks' array (one uint8 mask per image)",
                           dataset_id=dataset.id)
    if not channels:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {model.id} has no layout conditioning; layout_source "
                           "applies only to models pretrained with layout_conditioning",
                           model_id=model.id)
    return dataset


def layout_record(dataset: Dataset, *, per_class: bool) -> dict[str, Any]:
    """What a generate job records about its layouts (job result, shown to readers)."""
    return {"dataset_id": dataset.id, "visibility": dataset.visibility,
            "declared_public_by": dataset.declared_public_by, "per_class": per_class,
            "sha256": dataset.sha256}
