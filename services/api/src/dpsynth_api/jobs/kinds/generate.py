"""Admitting a ``generate`` job, and where its layout masks come from (DP-DocLDM layout
conditioning).

A generate job samples a diffusion model of the tenant; never a feature network
(``kinds/feature_net.py``) and never a model trained with a test random generator (its noise
is predictable: no DP guarantee, so its samples are never released; docs/privacy.md).

Only PUBLIC masks may condition sampling: a public dataset (such as the synthetic documents
of :mod:`dpsynth_shared.documents`) or masks their uploader declared public (the dataset
records the key that did, ``declared_public_by``). A mask taken from a private dataset would
be copied into a released document: its privacy loss is unbounded, so no charge to the
dataset's budget could cover it, and it is refused with ``private_conditioning_refused``.

The other source is a layout generator (``layout_source.model_id``): a model trained with
``target: masks``, pretrained on public masks or DP-finetuned on a private dataset's masks
(an ordinary finetune, charged to that dataset's budget). Its sampled masks are
post-processing of that release and cost nothing more
(:func:`dpsynth_api.models.conditioning.check_layout_generator` says which models qualify).
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import GenerateSpec
from sqlalchemy.orm import Session

from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import Admission, AdmitContext
from dpsynth_api.jobs.kinds.feature_net import refuse_feature_net
from dpsynth_api.models.conditioning import check_layout_generator, layout_channels
from dpsynth_api.models.service import get_model
from dpsynth_api.tables import Dataset, Model
from dpsynth_api.tenants.security import Principal


def admit(ctx: AdmitContext, spec: GenerateSpec) -> Admission:
    """The model a generate job samples and its layout source, recorded in the job's result
    (the public dataset and who declared it public, or the layout generator).

    Raises:
        DpsynthError: 404 for a model the tenant does not have; 422 ``invalid_spec`` for a
            feature network; 409 ``not_publishable`` for a test-rng model; the layout
            source's refusals (:func:`resolve_layout_source`).
    """
    model = get_model(ctx.session, principal=ctx.principal, model_id=spec.model_id)
    refuse_feature_net(model, "model a generate job samples")
    if model.rng == "test":
        # docs/privacy.md: a model trained with a test-injected seeded generator has
        # predictable noise; its outputs carry no DP guarantee and are never released.
        raise DpsynthError(ErrorCode.NOT_PUBLISHABLE,
                           f"model {model.id} was trained with a test random generator "
                           "(rng: test); its samples can never be published")
    layout = resolve_layout_source(ctx.session, principal=ctx.principal, spec=spec, model=model)
    result: dict[str, Any] = {}
    if spec.layout_source and layout:
        result["layout_source"] = layout_record(layout, per_class=spec.layout_source.per_class)
    return Admission(model_id=model.id, result=result)


def resolve_layout_source(session: Session, *, principal: Principal, spec: GenerateSpec,
                          model: Model) -> Dataset | Model | None:
    """The public dataset or the layout generator whose masks condition a generate job, or
    None without layouts.

    Raises:
        DpsynthError: 404 for a dataset or model the tenant does not have; 422
            ``private_conditioning_refused`` for a private dataset (or a layout model trained
            on private data without DP); 409 ``not_publishable`` for a test-rng layout
            model; 422 ``invalid_spec`` for a dataset without masks, a model that is not a
            layout generator, a layout-conditioned model without ``layout_source`` or a
            model without layout conditioning given one.
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
    if source.model_id is not None:
        generator = get_model(session, principal=principal, model_id=source.model_id)
        trained_on = session.get(Dataset, generator.dataset_id) if generator.dataset_id else None
        check_layout_generator(generator, trained_on)
        _require_layout_channels(model, channels)
        return generator
    assert source.dataset_id is not None  # LayoutSource names exactly one source
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
    _require_layout_channels(model, channels)
    return dataset


def _require_layout_channels(model: Model, channels: int) -> None:
    if not channels:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {model.id} has no layout conditioning; layout_source "
                           "applies only to models pretrained with layout_conditioning",
                           model_id=model.id)


def layout_record(source: Dataset | Model, *, per_class: bool) -> dict[str, Any]:
    """What a generate job records about its layouts (job result, shown to readers): the
    public dataset, or the layout generator with its privacy figure and its dataset."""
    if isinstance(source, Model):
        return {"model_id": source.id, "dp": bool(source.dp),
                "job_epsilon": source.job_epsilon, "delta": source.delta,
                "dataset_id": source.dataset_id, "per_class": per_class,
                "sha256": source.sha256}
    dataset = source
    return {"dataset_id": dataset.id, "visibility": dataset.visibility,
            "declared_public_by": dataset.declared_public_by, "per_class": per_class,
            "sha256": dataset.sha256}
