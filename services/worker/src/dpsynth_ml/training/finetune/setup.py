"""Setting up one DP finetune attempt: base model and private examples (encoded by the
frozen VAE, or as pixels for a pixel-space model), the trainable set, the optimizer, the DP
engine and the Poisson sampler of the privacy unit, all held in one :class:`FinetuneRun`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers.training_utils import EMAModel
from torch.optim.lr_scheduler import LambdaLR

from dpsynth_ml.data import ImageDataset, load_dataset, training_view
from dpsynth_ml.dp import (
    BookKeepingEngine,
    DpSgdEngine,
    PoissonSampler,
    SubjectPoissonSampler,
    choose_engine,
)
from dpsynth_ml.dp.distributed import (
    DistributedBookKeepingEngine,
    DistributedDpSgdEngine,
    ShardedPoissonSampler,
    ShardedSubjectPoissonSampler,
)
from dpsynth_ml.dp.padding import (
    FixedBatch,
    fixed_batch,
    public_size,
)
from dpsynth_ml.models.architectures import (
    ConditionalDenoiser,
    ModelBundle,
    reset_class_embedder,
)
from dpsynth_ml.models.codec import encode_records, vae_on
from dpsynth_ml.models.model_io import load_model, model_hash
from dpsynth_ml.models.trainable import apply_trainable, trains_embedder
from dpsynth_ml.parallel.distributed import Placement, resident, same_on_all_ranks
from dpsynth_ml.spec import (
    DpSpec,
    FinetuneRecipe,
    FinetuneTraining,
    InvalidSpecError,
    ModelInfo,
    PerLabel,
    RecordLevel,
    RngKind,
    SubjectLevel,
    WholeDataset,
)
from dpsynth_ml.training.checkpoint import (
    load_optimizer_state,
)
from dpsynth_ml.training.finetune import checkpoints
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.training.padded_encoding import encode_blanks
from dpsynth_ml.warmup.stage import central_images_stage


@dataclass
class FinetuneRun:
    """Everything one finetune attempt holds; built once, then stepped."""

    spec: FinetuneTraining
    dp: DpSpec
    bundle: ModelBundle
    info: ModelInfo
    latents: torch.Tensor
    labels: torch.Tensor
    engine: DpSgdEngine | BookKeepingEngine
    sampler: PoissonSampler | SubjectPoissonSampler | ShardedPoissonSampler | (
        ShardedSubjectPoissonSampler)
    trainable_names: list[str]
    generator: torch.Generator
    out_dir: Path
    start_step: int
    rng: RngKind
    lr_schedule: LambdaLR | None = None
    ema: EMAModel | None = None
    layouts: torch.Tensor | None = None  # encoded private masks (layout-conditioned models)
    # rank/world/device; the data tensors stay on the CPU, each micro-batch is moved
    placement: Placement = dataclasses.field(default_factory=Placement)
    # rows every logical step processes (public; dp.padding), set by prepare
    fixed: FixedBatch | None = None
    # the micro-batch size in use: the spec's max_physical_batch_size, halved by the loop
    # when a record-level step runs out of accelerator memory (loop.logical_step); 0: the
    # spec's
    physical_batch: int = 0


def whole_dataset_privacy(spec: FinetuneTraining) -> WholeDataset:
    """The privacy of a one-model finetune (a per-label spec goes through ``per_label``).

    Raises:
        InvalidSpecError: for a per-label spec.
    """
    if isinstance(spec.privacy, PerLabel):
        raise InvalidSpecError("a per-label finetune trains one model per class "
                               "(dpsynth_ml.training.per_label)")
    return spec.privacy


def _fixed_batch(privacy: WholeDataset, placement: Placement) -> FixedBatch:
    """Rows per logical step (per rank), from public quantities only (dp.padding)."""
    dp = privacy.dp
    return fixed_batch(sample_rate=dp.sample_rate, expected_batch_size=dp.expected_batch_size,
                       steps=dp.steps, epsilon=dp.epsilon, delta=dp.delta,
                       world_size=placement.world_size,
                       rows_per_unit=(privacy.max_images_per_subject
                                      if isinstance(privacy, SubjectLevel) else 1))


def _sampler(privacy: WholeDataset, dataset: ImageDataset,
             generator: torch.Generator, placement: Placement, public_size: int | None = None,
             ) -> PoissonSampler | SubjectPoissonSampler | ShardedPoissonSampler | (
                 ShardedSubjectPoissonSampler):
    """The Poisson sampler of the spec's privacy unit (images, or subjects); on W ranks,
    this rank's shard of it, at the same rate q. ``public_size`` (N̂, per rank) sets how
    many uniforms each draw takes, whatever the true count.

    Raises:
        InvalidSpecError: a subject-unit job on a dataset without subjects, or an image-unit
            job on a dataset that carries them (its budget counts subjects).
    """
    dp = privacy.dp
    if isinstance(privacy, SubjectLevel):
        if dataset.subjects is None or dataset.num_subjects is None:
            raise InvalidSpecError("privacy_unit 'subject' needs a dataset with subjects")
        if placement.distributed:
            return ShardedSubjectPoissonSampler(
                dataset.subjects, dataset.num_subjects, dp.sample_rate, generator,
                rank=placement.rank, world_size=placement.world_size,
                max_images_per_subject=privacy.max_images_per_subject, public_size=public_size)
        return SubjectPoissonSampler(dataset.subjects, dataset.num_subjects, dp.sample_rate,
                                     generator,
                                     max_images_per_subject=privacy.max_images_per_subject,
                                     public_size=public_size)
    if dataset.subjects is not None:
        raise InvalidSpecError("the dataset's privacy unit is 'subject': it trains only "
                               "with user-level DP-SGD (privacy_unit 'subject')")
    if placement.distributed:
        return ShardedPoissonSampler(len(dataset), dp.sample_rate, generator,
                                     rank=placement.rank, world_size=placement.world_size,
                                     public_size=public_size)
    return PoissonSampler(len(dataset), dp.sample_rate, generator, public_size=public_size)


def prepare(spec: FinetuneTraining, *, dataset_path: Path, out_dir: Path,
             base_model_dir: Path | None, resume_from: Path | None,
             generator: torch.Generator, rng: RngKind,
             dataset: ImageDataset | None = None,
             placement: Placement | None = None,
             hooks: TrainingHooks | None = None) -> FinetuneRun:
    """Load model and data, select trainable parameters, warm up on the central images
    (``spec.central_images``: released and charged through ``hooks``, see
    :mod:`dpsynth_ml.warmup.stage`), build the DP engine."""
    placement = placement if placement is not None else Placement()
    privacy = whole_dataset_privacy(spec)
    dp = privacy.dp
    source = resume_from if resume_from is not None else base_model_dir
    if source is None:
        raise InvalidSpecError("a finetune needs base_model_dir or resume_from")
    bundle, info = load_model(source)
    # DP noise: a fresh OS key per engine (attempt) unless THIS attempt's generator was
    # injected by a test (docs/privacy.md, "The noise source"); decided before the override
    noise_generator = generator if rng == "test" else None
    if resume_from is not None and info.rng == "test":
        rng = "test"  # a model is "test" if any attempt in its history was seeded by a test
    start_step = checkpoints.resume_step(resume_from, dp) if resume_from is not None else 0
    dataset = dataset if dataset is not None else load_dataset(dataset_path)
    with vae_on(bundle, placement.device):
        # the frozen VAE encodes the private records (and the blanks up to N̂) on the
        # job's device, in float32 and without autocast; the encoded examples then stay on
        # an accelerator when they fit (``resident``: the loop gathers each step's rows
        # there, padding included) and come back to the host otherwise
        data = model_and_data(spec, bundle, info, dataset, base_model_dir,
                               fresh=resume_from is None)
        fixed = _fixed_batch(privacy, placement)
        if isinstance(privacy, RecordLevel):  # encoding costs N̂ records whatever the count
            encode_blanks(bundle, info, real=len(dataset), masks=data.layouts is not None,
                          public=public_size(sample_rate=dp.sample_rate,
                                             expected_batch_size=dp.expected_batch_size))
    info, labels = data.info, data.labels
    latents = resident(data.latents, placement.device)
    layouts = resident(data.layouts, placement.device) if data.layouts is not None else None
    names, denoiser = data.names, data.denoiser
    # built (no draw yet) before the central images: a dataset whose unit does not fit the
    # privacy is refused before any release is charged
    sampler = _sampler(privacy, dataset, generator, placement, fixed.population)
    # the ranks must sample the same N at the same q from the same step on (a resume of
    # the same checkpoint), or the union would not be the accounted Poisson sample
    if not same_on_all_ranks(placement, [dp.sample_rate, float(sampler.num_records),
                                         float(dp.steps), float(start_step),
                                         float(spec.noise_multiplicity)]):
        raise RuntimeError("the ranks disagree on the dataset size, q, steps or start step")
    denoiser.to(placement.device)  # before the optimizer: its state lives with the params
    if spec.central_images is not None:
        if hooks is None:
            raise InvalidSpecError("central_images needs the run's hooks (to charge it)")
        # DP release + non-private warm-up of the whole denoiser, before the DP optimizer,
        # engine and EMA exist: DP-SGD starts from the warmed-up weights
        info = central_images_stage(spec, dataset=dataset, bundle=bundle, info=info,
                                    denoiser=denoiser, out_dir=Path(out_dir),
                                    resume_from=resume_from, hooks=hooks,
                                    generator=generator, test_generator=noise_generator,
                                    train_embedder=trains_embedder(spec), placement=placement)
    named = dict(denoiser.named_parameters())
    optimizer = torch.optim.AdamW([named[n] for n in names], lr=spec.learning_rate,
                                  weight_decay=0.0)
    if resume_from is not None:
        load_optimizer_state(optimizer, names, resume_from)
        _optimizer_state_to(optimizer, placement.device)
    # expected_batch_size is the GLOBAL E on every rank (the distributed engine divides the
    # all-reduced sum by it once).
    # book-keeping where it is exact and faster, opacus hooks elsewhere (dp.choice); the
    # mechanism is the same, the choice is recorded with the model
    kind = choose_engine(denoiser)
    engine_class: type[DpSgdEngine] | type[BookKeepingEngine]
    if kind == "bookkeeping":
        engine_class = (DistributedBookKeepingEngine if placement.distributed
                        else BookKeepingEngine)
    else:
        engine_class = DistributedDpSgdEngine if placement.distributed else DpSgdEngine
    engine = engine_class(denoiser, optimizer, noise_multiplier=dp.noise_multiplier,
                          max_grad_norm=dp.max_grad_norm,
                          expected_batch_size=dp.expected_batch_size,
                          generator=noise_generator)
    info = dataclasses.replace(info, extra={**info.extra, "dp_engine": kind})
    return FinetuneRun(spec=spec, dp=dp, bundle=bundle, info=info, latents=latents, labels=labels,
                engine=engine, sampler=sampler, trainable_names=names, generator=generator,
                out_dir=Path(out_dir), start_step=start_step, rng=rng, layouts=layouts,
                placement=placement, fixed=fixed)


def _optimizer_state_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move restored optimizer state (loaded on the CPU) to the parameters' device."""
    if device.type == "cpu":
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            # AdamW keeps its scalar "step" on the CPU unless capturable/fused
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device)


@dataclass
class ModelAndData:
    """The model with its trainable set selected and the encoded training examples."""

    info: ModelInfo
    latents: torch.Tensor
    layouts: torch.Tensor | None
    labels: torch.Tensor
    names: list[str]
    denoiser: ConditionalDenoiser


def model_and_data(spec: FinetuneRecipe, bundle: ModelBundle, info: ModelInfo,
                    dataset: ImageDataset, base_model_dir: Path | None, *,
                    fresh: bool) -> ModelAndData:
    """Check spec/data/model, encode the examples, select the trainable parameters.

    Shared by the DP finetune and the non-private benchmark mode so both train exactly the
    same parameters on exactly the same examples.
    """
    # target "masks" (a layout generator): the private masks take the images' place, each
    # one its record's example under the same Poisson sampling and clipping.
    dataset = training_view(dataset, spec.target)
    base_classes = tuple(info.class_names)
    info = _finetune_info(spec, info, dataset, base_model_dir, fresh=fresh)
    if fresh and spec.class_map is None:
        # new labels get a fresh class table; a base model that already has exactly the
        # dataset's classes (same names, same order: a public model of the same label
        # space, or the output of an earlier finetune) keeps its learned one
        kept = base_classes == tuple(dataset.class_names)
        if not kept:
            reset_class_embedder(bundle, spec.num_classes)
        info = dataclasses.replace(info, extra={**info.extra,
                                                "class_table": "kept" if kept else "fresh"})
    latents = _encode(bundle, dataset, info)
    # Masks of a private dataset are private: read here, inside the DP job, and each one is
    # part of its example (same Poisson sample, same per-example clipping).
    layouts = _encode_masks(bundle, dataset, info)
    labels = _model_labels(dataset, spec)
    names = _select_trainable(bundle, spec)
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).train()
    named = dict(denoiser.named_parameters())
    count = sum(named[n].numel() for n in names)
    info = dataclasses.replace(info, extra={**info.extra, "trainable_parameters": count})
    return ModelAndData(info=info, latents=latents, layouts=layouts, labels=labels,
                         names=names, denoiser=denoiser)


def _finetune_info(spec: FinetuneRecipe, base: ModelInfo, dataset: ImageDataset,
                   base_model_dir: Path | None, *, fresh: bool) -> ModelInfo:
    """Check compatibility of spec, data and base model; return the output's info."""
    if (spec.image_size, spec.channels) != (base.image_size, base.channels):
        raise InvalidSpecError("image_size/channels differ from the base model's")
    num_private = len(dataset.class_names)
    if spec.class_map is None:
        if spec.num_classes != num_private:
            raise InvalidSpecError("num_classes must equal the dataset's number of classes")
        class_names = dataset.class_names
    else:
        if spec.num_classes != base.num_classes:
            raise InvalidSpecError("with a class_map, num_classes must be the base model's")
        if set(spec.class_map) != set(range(num_private)):
            raise InvalidSpecError("class_map must map every private class index")
        class_names = base.class_names
    extra: dict[str, object] = dict(base.extra) if not fresh else {
        "base_model_hash": model_hash(base_model_dir) if base_model_dir else None}
    extra.update({"trainable": spec.trainable, "class_map_given": spec.class_map is not None,
                  "train_embedder": trains_embedder(spec)})
    if spec.trainable == "blocks":
        extra["blocks"] = list(spec.blocks or ())
    if spec.trainable == "lora":
        extra["lora"] = {"rank": spec.lora_rank, "alpha": float(
            spec.lora_alpha if spec.lora_alpha is not None else spec.lora_rank),
            "merged": True}
    if spec.target == "masks":
        if base.extra.get("layout_channels"):
            raise InvalidSpecError("a layout generator (target 'masks') cannot start from a "
                                   "layout-conditioned base model")
        extra["target"] = "masks"
    else:
        extra.pop("target", None)
    if base.extra.get("layout_channels") and dataset.masks is None:
        raise InvalidSpecError("the base model is layout-conditioned: the private dataset "
                               "must carry one layout mask per image")
    return ModelInfo(format_version=base.format_version, preset=base.preset,
                     image_size=base.image_size, channels=base.channels,
                     latent_channels=base.latent_channels,
                     vae_scaling_factor=base.vae_scaling_factor,
                     num_classes=spec.num_classes, class_names=tuple(class_names),
                     null_class=spec.num_classes, rng=base.rng, training_kind="finetune",
                     steps=base.steps if not fresh else 0, extra=extra, space=base.space)


def _encode(bundle: ModelBundle, dataset: ImageDataset, info: ModelInfo) -> torch.Tensor:
    """Scaled VAE latents (posterior means) of all images, the VAE frozen; a pixel-space
    model's images in [-1, 1] (``codec``)."""
    if len(dataset) == 0:
        return _no_latents(bundle, info)
    return encode_records(bundle, info, dataset.images)


def _no_latents(bundle: ModelBundle, info: ModelInfo) -> torch.Tensor:
    """Latents [0, C, h, w] of a dataset without records.

    A per-label class may hold no record (its declared size is public, its true count is
    not): its steps still run, each releasing pure noise and processing the same padded
    rows as a class with records (dp.padding); refusing would reveal the count. The shape
    comes from a blank image, not data.
    """
    blank = np.zeros((1, info.image_size, info.image_size, info.channels), dtype=np.uint8)
    return encode_records(bundle, info, blank)[:0]


def _encode_masks(bundle: ModelBundle, dataset: ImageDataset,
                  info: ModelInfo) -> torch.Tensor | None:
    """Encoded layout masks of all examples for a layout-conditioned model, else None.

    Raises:
        InvalidSpecError: the model is layout-conditioned and the dataset has no masks.
    """
    if bundle.layout_channels == 0:
        return None
    if dataset.masks is None:
        raise InvalidSpecError("the model is layout-conditioned: the private dataset must "
                               "carry one layout mask per image")
    if len(dataset) == 0:
        return _no_latents(bundle, info)
    return encode_records(bundle, info, dataset.masks)


def _model_labels(dataset: ImageDataset, spec: FinetuneRecipe) -> torch.Tensor:
    """Private label indices mapped to model class indices."""
    labels = torch.from_numpy(dataset.labels)
    if not spec.class_conditional:
        return torch.full_like(labels, spec.num_classes)  # every example is the null class
    if spec.class_map is None:
        return labels
    table = torch.tensor([spec.class_map[i] for i in range(len(dataset.class_names))])
    return table[labels]


def _select_trainable(bundle: ModelBundle, spec: FinetuneRecipe) -> list[str]:
    """Set requires_grad per the spec (LoRA: inject adapters); return trainable names.

    See :mod:`dpsynth_ml.models.trainable` for the modes; names are ConditionalDenoiser names.
    """
    return apply_trainable(bundle, spec)
