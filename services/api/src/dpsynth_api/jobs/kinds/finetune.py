"""Admitting a ``finetune`` job: the DP path for PRIVATE datasets.

The admission checks what no schema can express (the dataset's visibility, adjacency and
class sizes, the base model's kind and layout conditioning), before any budget is reserved
so that a refused option costs nothing, and says what to reserve: one DP-SGD run, or one run
per class of a per-label job (each class's sample rate from its public declared size).
"""

from __future__ import annotations

from dpsynth_shared.central_images import MAX_SECOND_MOMENT_DIM, second_moment_dim
from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FinetuneSpec, steps_for
from dpsynth_shared.ledger_contract import LabelShape, ReserveRequest
from dpsynth_shared.plan_limits import check_plan_size
from dpsynth_shared.release_contract import CentralImagesTerms

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs.kinds.base import (
    Admission,
    AdmitContext,
    budget_terms,
    require_masks_for_target,
    require_visibility,
)
from dpsynth_api.jobs.kinds.feature_net import refuse_feature_net
from dpsynth_api.models.conditioning import layout_channels
from dpsynth_api.models.service import get_model
from dpsynth_api.tables import Dataset, Model

DP_PROMISE_DOC = "docs/privacy/dp-promise.md"
_PRIVATE_ONLY = ("finetune jobs are the DP path for PRIVATE datasets; train on public data "
                 "with a pretrain job")


def admit(ctx: AdmitContext, spec: FinetuneSpec) -> Admission:
    """The private dataset, the base model and the reservation of a finetune job.

    Raises:
        DpsynthError: 404, 410 ``dataset_deleted``, 422 ``visibility_mismatch`` /
            ``invalid_spec`` / ``unsupported_neighbouring`` / ``method_not_offered``, and
            the plan-size refusals of :func:`~dpsynth_shared.plan_limits.check_plan_size`.
    """
    dataset = get_dataset(ctx.session, principal=ctx.principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    require_visibility(dataset, "private", "finetune", _PRIVATE_ONLY)
    check_finetune_options(dataset, spec)
    require_masks_for_target(dataset, spec.training.target)
    base = get_model(ctx.session, principal=ctx.principal, model_id=spec.base_model_id)
    refuse_feature_net(base, "base model of a finetune job")
    if spec.training.target == "masks" and layout_channels(base.info or {}):
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {base.id} is layout-conditioned: a layout generator (target "
                           "'masks') starts from a model without layout conditioning",
                           model_id=base.id)
    if spec.training.per_label:
        return _admit_per_label(ctx, spec, dataset, base)
    batch = spec.training.expected_batch_size
    budget_id, population = budget_terms(dataset)
    check_central_images(dataset, base, spec, charges_other_budget=population is not None)
    if batch > dataset.declared_size:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"expected_batch_size {batch} exceeds the dataset's declared size "
                           f"N̂ = {dataset.declared_size} (the sample rate q = batch / N̂ "
                           "must be at most 1)", declared_size=dataset.declared_size)
    steps = steps_for(epochs=spec.training.epochs, expected_batch_size=batch,
                      declared_size=dataset.declared_size)
    terms = central_images_terms(base, spec)
    reserve = ReserveRequest(job_id=ctx.job_id, dataset_id=budget_id,
                             target_epsilon=spec.privacy.target_epsilon,
                             expected_batch_size=batch, steps=steps, population_size=population,
                             central_images=terms)
    check_plan_size(reserve, ctx.limits)  # the ledger's bounds (api setting), refused early
    return Admission(dataset=dataset, model_id=base.id, steps=steps, reserve=reserve,
                     warnings=(_class_table_warnings(dataset, base, spec)
                               + _central_images_warnings(spec, composed=terms is not None)))


def central_images_terms(base: Model, spec: FinetuneSpec) -> CentralImagesTerms | None:
    """The public terms of the job's central-image release, as the worker will ask the ledger
    to charge them (the base model's image shape, the spec's release settings), so that the
    plan and the admission compose the release with DP-SGD; None without a release or when
    the base model does not record its image shape."""
    central = spec.training.central_images
    info = base.info or {}
    size, channels = int(info.get("image_size") or 0), int(info.get("channels") or 0)
    if central is None or not size or not channels:
        return None
    return CentralImagesTerms(
        target_epsilon=central.target_epsilon, image_size=size, channels=channels,
        downsample=central.downsample, sample_rate=central.sample_rate,
        queries=central.queries, second_moments=central.second_moments)


def _central_images_warnings(spec: FinetuneSpec, *, composed: bool) -> list[str]:
    """A central-image release is its own ledger event, charged when the job starts. The plan
    composes it when the base model records its image shape (``composed``); otherwise the
    plan's figures are the DP-SGD part's and a dry run must say that the dataset will spend
    more."""
    central = spec.training.central_images
    if central is None:
        return []
    if composed:
        return [f"training.central_images: the job first releases its class statistics at a "
                f"standalone epsilon of {central.target_epsilon:g}, charged as its own ledger "
                f"event when the job starts; the plan's dataset_epsilon_spent_after, tight "
                f"figure and admissible compose it with the DP-SGD part (plan.central_images), "
                f"while job_epsilon is the DP-SGD part's. The reservation holds the DP-SGD "
                f"part only: the release is refused at the start if other jobs have taken its "
                f"room meanwhile"]
    return [f"training.central_images: the job also releases its class statistics at a "
            f"standalone epsilon of {central.target_epsilon:g}, charged as its own ledger "
            f"event when the job starts (before DP-SGD); the base model records no image "
            f"shape, so the plan's dataset_epsilon_spent_after and tight figure count the "
            f"DP-SGD part only, and the dataset's spent epsilon after the job is higher (both "
            f"composed under the budget's filter; the ledger refuses the release if it does "
            f"not fit)"]


def _admit_per_label(ctx: AdmitContext, spec: FinetuneSpec, dataset: Dataset,
                     base: Model) -> Admission:
    """A per-label finetune: one run per class, on the dataset that owns its budget."""
    budget_id, population = budget_terms(dataset)
    if population is not None:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"dataset {dataset.id} charges the budget of dataset "
                           f"{budget_id}; per-label jobs run only on the dataset that "
                           "owns its budget (the budget's class partitions and sizes are "
                           "that dataset's)", dataset_id=dataset.id, budget_id=budget_id)
    shapes = per_label_shapes(dataset, spec)
    reserve = ReserveRequest(job_id=ctx.job_id, dataset_id=budget_id,
                             target_epsilon=spec.privacy.target_epsilon, per_label=shapes)
    check_plan_size(reserve, ctx.limits)  # the ledger's bounds (api setting), refused early
    return Admission(dataset=dataset, model_id=base.id, reserve=reserve,
                     steps=sum(shape.steps for shape in shapes.values()))


def _class_table_warnings(dataset: Dataset, base: Model, spec: FinetuneSpec) -> list[str]:
    """A finetune without ``class_map`` learns the class table afresh under DP; when the
    base model was pretrained on classes of the same names, keeping its table is almost
    always meant (a short DP run learns a fresh one poorly: near-chance samples). Public
    facts only: the dataset's declared class names and the model's."""
    training = spec.training
    base_names = (base.info or {}).get("class_names") or []
    extra = (base.info or {}).get("extra") or {}
    if (training.class_map is not None or not training.class_conditional or not base_names
            or extra.get("initialised_only")):  # an untrained table has nothing to keep
        return []
    same = [name for name in dataset.class_names if name in base_names]
    if len(same) != len(dataset.class_names):
        return []
    example = ", ".join(f'"{n}": "{n}"' for n in same[:3]) + (", ..." if len(same) > 3 else "")
    return [f"the base model {base.id} was pretrained on the same classes, but without "
            "training.class_map this job learns a fresh class table under DP, which a short "
            "DP run does poorly (samples near chance); to keep the base model's table set "
            f"training.class_map {{{example}}} (each class to its own name)"]


def per_label_shapes(dataset: Dataset, spec: FinetuneSpec) -> dict[str, LabelShape]:
    """Each class's run of a per-label finetune, from the dataset's public class sizes.

    Class c trains on its N̂_c declared records with expected batch size
    ``min(expected_batch_size, N̂_c)`` for ``steps_for(epochs, batch_c, N̂_c)`` logical steps;
    the ledger sets q_c = batch_c / N̂_c from the same declared sizes.

    Raises:
        DpsynthError: 422 ``invalid_spec`` when the dataset declares no class sizes (they
            are never read from the data).
    """
    sizes = dataset.class_sizes
    if not sizes:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"training.per_label needs public class sizes, and dataset "
                           f"{dataset.id} declares none: each class's sample rate is set by "
                           "its declared size, never read from the data. Upload the dataset "
                           "with class_sizes in its metadata (every class, each at least its "
                           "true count)", dataset_id=dataset.id)
    t = spec.training
    shapes: dict[str, LabelShape] = {}
    for name in dataset.class_names:
        size = int(sizes[name])
        batch = min(t.expected_batch_size, size)
        shapes[name] = LabelShape(expected_batch_size=batch, steps=steps_for(
            epochs=t.epochs, expected_batch_size=batch, declared_size=size))
    return shapes


def check_central_images(dataset: Dataset, base: Model, spec: FinetuneSpec, *,
                         charges_other_budget: bool) -> None:
    """Refuse a central-image warm-up the platform cannot release correctly on this dataset.

    The release divides each class's noisy sum by the dataset's PUBLIC class size N̂_c
    (never the true count), so the dataset must declare class sizes, and they must be the
    budget's own (a derived or linked dataset reads a subset of its parent's records under
    the parent's sizes). The release block-averages the base model's images by
    ``downsample``, which must divide their side. Public facts only.

    Raises:
        DpsynthError: 422 ``invalid_spec``.
    """
    central = spec.training.central_images
    if central is None:
        return
    if not dataset.class_sizes:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"training.central_images divides each class's noisy sum by the "
                           f"class's public size N̂_c, and dataset {dataset.id} declares none "
                           "(they are never read from the data). Upload the dataset with "
                           "class_sizes in its metadata, or release them first through the "
                           "charged class-size histogram", dataset_id=dataset.id)
    if charges_other_budget:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"dataset {dataset.id} charges another dataset's budget; "
                           "training.central_images runs only on the dataset that owns its "
                           "budget (its declared class sizes normalise the release)",
                           dataset_id=dataset.id)
    size = int((base.info or {}).get("image_size") or 0)
    if size and size % central.downsample:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"training.central_images.downsample {central.downsample} must "
                           f"divide the base model's image size {size}",
                           model_id=base.id, image_size=size)
    channels = int((base.info or {}).get("channels") or 0)
    if central.second_moments and size and channels:
        dim = second_moment_dim(size, channels, central.downsample)
        if dim > MAX_SECOND_MOMENT_DIM:
            raise DpsynthError(ErrorCode.INVALID_SPEC,
                               f"training.central_images.second_moments on {dim} downsampled "
                               f"coordinates ({size}x{size}x{channels} / downsample "
                               f"{central.downsample}): at most {MAX_SECOND_MOMENT_DIM} (a "
                               "d x d matrix per class); raise downsample",
                               model_id=base.id, dimension=dim)


def check_finetune_options(dataset: Dataset, spec: FinetuneSpec) -> None:
    """Refuse training options the platform cannot account for on this dataset.

    Raises:
        DpsynthError: 422 ``unsupported_neighbouring`` for DP-Promise on an add/remove
            dataset; 422 ``method_not_offered`` for DP-Promise on a replace-one dataset.
    """
    if spec.training.algorithm != "dp_promise":
        return
    relation = Neighbouring(dataset.neighbouring or Neighbouring.ADD_REMOVE)
    if relation == Neighbouring.ADD_REMOVE:
        raise DpsynthError(
            ErrorCode.UNSUPPORTED_NEIGHBOURING,
            "DP-Promise's phase 1 releases one noised latent per record: under add/remove "
            "adjacency that release has no finite epsilon (a record's noised latent is "
            "either there or not), so it is analysed under replace-one only, and group "
            "privacy never converts a replace-one analysis into an add/remove one. This "
            f"dataset is add/remove; see {DP_PROMISE_DOC}",
            dataset_neighbouring=str(relation), algorithm="dp_promise")
    raise DpsynthError(
        ErrorCode.METHOD_NOT_OFFERED,
        "DP-Promise is not offered: its phase 2 (DP-SGD, add/remove) could now enter this "
        "replace-one dataset through the ledger's group privacy, but phase 1 as published is "
        "not accountable (unclipped latents, a training target that depends on the clean "
        "latent, class-conditional release counts); only a corrected variant could be "
        f"offered; see {DP_PROMISE_DOC}",
        dataset_neighbouring=str(relation), algorithm="dp_promise")
