"""DP fine-tuning of a pretrained latent diffusion model (DP-LDMs, Liu et al., TMLR 2024).

The VAE is frozen and only encodes the private images; the UNet's attention modules (or the
whole UNet) and, when labels are new, the class embedder are trained with DP-SGD (Abadi et
al. 2016; diffusion-specific practice from DPDM, Dockhorn et al.). Only the DP-trained UNet
and embedder depend on private data, so the released model is DP by post-processing.

Each logical step Poisson-samples once over the whole dataset, pads the sample with masked
rows to a fixed number of rows computed from public quantities (``dp.padding``: every step
costs the same whatever the data; a rare larger sample is processed whole, in extra padded
chunks, never truncated), splits it into physical micro-batches of
``max_physical_batch_size``, draws
label dropout once per sampled example, lets each example's loss average ``K =
noise_multiplicity`` (timestep, noise) draws before its one gradient is clipped, adds the
noise once and divides by ``expected_batch_size`` (``DpSgdEngine``). The optimiser's rate
follows a linear warm-up over logical steps; with ``ema_decay`` an EMA of the trained
weights (diffusers ``EMAModel``) is what the model and checkpoints release, while
checkpoints also keep the raw weights to resume from (post-processing of DP outputs, free).

With ``privacy_unit: subject`` the step is user-level DP-SGD (:func:`_subject_step`):
Poisson sampling over subjects, up to ``max_images_per_subject`` images of each sampled
subject chosen uniformly, their per-example gradients averaged into ONE contribution per
subject, clipped once; the noised sum is divided by the expected number of subjects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers.training_utils import EMAModel
from torch.optim.lr_scheduler import LambdaLR

from dpsynth_ml.checkpoint import (
    EMA_FILE,
    TRAINABLE_FILE,
    load_named_tensors,
    load_optimizer_state,
    read_trainer_state,
    restore_schedule,
    save_named_tensors,
    save_optimizer_state,
    schedule_state,
    warmup_schedule,
    write_trainer_state,
)
from dpsynth_ml.data import ImageDataset, load_dataset, training_view
from dpsynth_ml.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.distributed import Placement, RankHooks, broadcast_flag, same_on_all_ranks
from dpsynth_ml.dp import DpSgdEngine, PoissonSampler, SubjectPoissonSampler
from dpsynth_ml.dp.distributed import (
    DistributedDpSgdEngine,
    ShardedPoissonSampler,
    ShardedSubjectPoissonSampler,
)
from dpsynth_ml.dp.padding import (
    FixedBatch,
    fixed_batch,
    gather_rows,
    mask_losses,
    pad_groups,
    pad_indices,
    public_size,
)
from dpsynth_ml.hooks import TrainingHooks
from dpsynth_ml.model_io import load_model, model_hash, save_model
from dpsynth_ml.models import (
    ConditionalDenoiser,
    ModelBundle,
    encode_images,
    reset_class_embedder,
)
from dpsynth_ml.padded_encoding import encode_blanks
from dpsynth_ml.spec import (
    DpSpec,
    InvalidSpecError,
    ModelInfo,
    RngKind,
    TrainingResult,
    TrainingSpec,
)
from dpsynth_ml.trainable import apply_trainable, trains_embedder


@dataclass
class _Run:
    """Everything one finetune attempt holds; built once, then stepped."""

    spec: TrainingSpec
    dp: DpSpec
    bundle: ModelBundle
    info: ModelInfo
    latents: torch.Tensor
    labels: torch.Tensor
    engine: DpSgdEngine
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
    # rows every logical step processes (public; dp.padding), set by _prepare
    fixed: FixedBatch | None = None


def run_finetune(spec: TrainingSpec, *, dataset_path: Path, out_dir: Path, hooks: TrainingHooks,
                 base_model_dir: Path | None, resume_from: Path | None,
                 generator: torch.Generator, rng: RngKind,
                 dataset: ImageDataset | None = None,
                 placement: Placement | None = None) -> TrainingResult:
    """Run (or resume) a DP finetune; see :func:`dpsynth_ml.train` for the contract.

    ``dataset``, when given, is used instead of loading ``dataset_path`` (per-label training
    passes one class's records). ``placement`` puts the trained model on a device and, with
    a world size W > 1, makes this process one rank of a W-rank job (docs/multi-gpu.md):
    every rank calls this with its own generator; only rank 0 talks to ``hooks`` and writes
    checkpoints and the model.
    """
    placement = placement if placement is not None else Placement()
    if placement.distributed:
        hooks = RankHooks(hooks, placement)
    run = _prepare(spec, dataset_path=dataset_path, out_dir=out_dir,
                   base_model_dir=base_model_dir, resume_from=resume_from,
                   generator=generator, rng=rng, dataset=dataset, placement=placement)
    _attach_schedule_and_ema(run, resume_from)
    step, stopped = _train_loop(run, hooks)
    run.engine.close()
    last = out_dir / "checkpoints" / _checkpoint_name(step)
    # rank 0's disk decides, for every rank (_checkpoint is collective on W ranks)
    if broadcast_flag(placement, step > run.start_step and not last.exists()):
        _checkpoint(run, step, hooks)
    model_dir = out_dir / "model"
    if placement.is_main:
        with _released_weights(run):
            model_dir = save_model(run.bundle, _stamp(run, step), model_dir)
        write_trainer_state(out_dir, _trainer_state(run, step))
    trainable = sum(p.numel() for p in run.engine.params)
    return TrainingResult(steps_completed=step, stopped_early=stopped, model_dir=model_dir,
                          trainable_parameters=trainable,
                          total_parameters=run.bundle.parameter_count(), rng=run.rng)


def _train_loop(run: _Run, hooks: TrainingHooks) -> tuple[int, bool]:
    """Lease steps in chunks of ``checkpoint_every``; return (steps done, stopped early)."""
    total, step = run.dp.steps, run.start_step
    while step < total:
        if hooks.should_stop():
            return step, True
        wanted = min(run.spec.checkpoint_every, total - step)
        # The platform charges privacy budget here, before any of these steps run.
        granted = max(0, min(int(hooks.acquire_steps(step, wanted)), wanted))
        if granted == 0:
            return step, True
        for i in range(granted):
            if i > 0 and hooks.should_stop():
                return step, True
            hooks.on_private_stats(_logical_step(run))
            step += 1
            hooks.on_progress(step, total)
            if step % run.spec.checkpoint_every == 0 or step == total:
                _checkpoint(run, step, hooks)
    return step, False


def _logical_step(run: _Run) -> dict[str, float]:
    """One DP-SGD step: Poisson batch → padded to the fixed rows → micro-batches →
    clip/sum → noise once → update.

    Only the examples of the Poisson batch are drawn for (label dropout, K diffusion draws);
    the rest of the dataset is not touched. Padding rows (zero latents and layouts, the null
    label) go through the same passes with their loss multiplied by 0, so their gradient is
    exactly 0 and the clipped sum is the unpadded one (dp.padding). Returns owner-only,
    non-DP statistics.
    """
    if isinstance(run.sampler, (SubjectPoissonSampler, ShardedSubjectPoissonSampler)):
        return _subject_step(run, run.sampler)
    indices = run.sampler.sample()
    assert run.fixed is not None
    rows = pad_indices(indices, run.fixed)
    # Label dropout: one draw per sampled example per step, shared by its K diffusion draws
    # (the example is (x, y) or (x, null) for this step; K averages the diffusion objective
    # for that input, as DPDM's replicated rows share their label). Drawn for the whole
    # logical batch at once so the draws do not depend on the micro-batch split; each
    # example's gradient still depends on that example alone.
    labels = drop_labels(gather_rows(run.labels, rows.indices, fill=run.info.null_class),
                         probability=run.spec.label_dropout,
                         null_class=run.info.null_class, generator=run.generator)
    size, step_size = int(indices.numel()), run.spec.max_physical_batch_size
    loss_sum, clipped = 0.0, 0
    for start in range(0, len(rows), step_size):
        chunk, real = rows.indices[start:start + step_size], rows.real[start:start + step_size]
        latents, chunk_labels = _on_device(run, gather_rows(run.latents, chunk),
                                           labels[start:start + step_size])
        layout = (_on_device(run, gather_rows(run.layouts, chunk))[0]
                  if run.layouts is not None else None)

        def draw(latents: torch.Tensor = latents, chunk_labels: torch.Tensor = chunk_labels,
                 layout: torch.Tensor | None = layout,
                 real: torch.Tensor = real) -> torch.Tensor:
            return mask_losses(per_sample_diffusion_loss(
                run.engine.module, run.bundle.scheduler, latents, chunk_labels,
                run.generator, layout=layout), real)

        chunk_clipped, losses = run.engine.accumulate_draws(
            draw, run.spec.noise_multiplicity)
        clipped += chunk_clipped
        loss_sum += float(losses.sum())
    _noise_and_update(run)
    stats = {"batch_size": float(size), "rows": float(len(rows)),
             "fraction_clipped": clipped / size if size else 0.0}
    if size:
        stats["loss"] = loss_sum / size
    return stats


def _on_device(run: _Run, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A micro-batch's tensors on the model's device (no copy on the CPU)."""
    return tuple(t.to(run.placement.device) for t in tensors)


def _noise_and_update(run: _Run) -> None:
    """Noise the clipped sum once, apply it, then advance the LR schedule and the EMA."""
    run.engine.privatize()
    run.engine.apply_update()
    if run.lr_schedule is not None:
        run.lr_schedule.step()
    if run.ema is not None:
        run.ema.step(run.engine.params)


def _subject_step(run: _Run, sampler: SubjectPoissonSampler | ShardedSubjectPoissonSampler,
                  ) -> dict[str, float]:
    """One user-level DP-SGD step: Poisson over subjects → each sampled subject's (capped)
    images → per-example gradients (K draws each) → ONE clipped contribution per subject
    (the mean of its images' gradients) → noise once → update.

    The subjects' images are laid out contiguously and cut into micro-batches of
    ``max_physical_batch_size`` images; a subject cut by a boundary carries its partial
    (unclipped) contribution into the next micro-batch, so it is still clipped once.
    """
    batch = sampler.sample()
    assert run.fixed is not None
    # padded to cap_subjects x max_images_per_subject rows; each padding row is its own
    # zero-weight, zero-loss "subject", so it never joins or carries a real one
    rows = pad_indices(batch.indices, run.fixed)
    size, total = int(batch.indices.numel()), len(rows)
    groups = pad_groups(batch.groups, total)
    labels = drop_labels(gather_rows(run.labels, rows.indices, fill=run.info.null_class),
                         probability=run.spec.label_dropout,
                         null_class=run.info.null_class, generator=run.generator)
    # the mean over the subject's sampled images: weight 1/n_j for each of its n_j images
    weights = torch.zeros(total, dtype=torch.float64)
    if size:
        weights[:size] = (1.0 / batch.counts.to(torch.float64))[batch.groups]
    step_size = run.spec.max_physical_batch_size
    loss_sum, clipped = 0.0, 0
    for start in range(0, total, step_size):
        end = min(start + step_size, total)
        chunk, real = rows.indices[start:end], rows.real[start:end]
        latents, chunk_labels = _on_device(run, gather_rows(run.latents, chunk),
                                           labels[start:end])
        layout = (_on_device(run, gather_rows(run.layouts, chunk))[0]
                  if run.layouts is not None else None)
        carry_in = start > 0 and bool(groups[start] == groups[start - 1])
        carry_out = end < total and bool(groups[end] == groups[end - 1])

        def draw(latents: torch.Tensor = latents, chunk_labels: torch.Tensor = chunk_labels,
                 layout: torch.Tensor | None = layout,
                 real: torch.Tensor = real) -> torch.Tensor:
            return mask_losses(per_sample_diffusion_loss(
                run.engine.module, run.bundle.scheduler, latents, chunk_labels,
                run.generator, layout=layout), real)

        chunk_clipped, losses = run.engine.accumulate_subject_draws(
            draw, run.spec.noise_multiplicity, groups[start:end] - groups[start],
            weights[start:end], carry_in=carry_in, carry_out=carry_out)
        clipped += chunk_clipped
        loss_sum += float(losses.sum())
    _noise_and_update(run)
    subjects = batch.num_subjects
    stats = {"batch_size": float(subjects), "images": float(size), "rows": float(total),
             "fraction_clipped": clipped / subjects if subjects else 0.0}
    if size:
        stats["loss"] = loss_sum / size
    return stats


def _fixed_batch(spec: TrainingSpec, dp: DpSpec, placement: Placement) -> FixedBatch:
    """Rows per logical step (per rank), from public quantities only (dp.padding)."""
    return fixed_batch(sample_rate=dp.sample_rate, expected_batch_size=dp.expected_batch_size,
                       steps=dp.steps, epsilon=dp.epsilon, delta=dp.delta,
                       world_size=placement.world_size,
                       rows_per_unit=(spec.max_images_per_subject
                                      if spec.privacy_unit == "subject" else 1))


def _sampler(spec: TrainingSpec, dp: DpSpec, dataset: ImageDataset,
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
    if spec.privacy_unit == "subject":
        if dataset.subjects is None or dataset.num_subjects is None:
            raise InvalidSpecError("privacy_unit 'subject' needs a dataset with subjects")
        if placement.distributed:
            return ShardedSubjectPoissonSampler(
                dataset.subjects, dataset.num_subjects, dp.sample_rate, generator,
                rank=placement.rank, world_size=placement.world_size,
                max_images_per_subject=spec.max_images_per_subject, public_size=public_size)
        return SubjectPoissonSampler(dataset.subjects, dataset.num_subjects, dp.sample_rate,
                                     generator,
                                     max_images_per_subject=spec.max_images_per_subject,
                                     public_size=public_size)
    if dataset.subjects is not None:
        raise InvalidSpecError("the dataset's privacy unit is 'subject': it trains only "
                               "with user-level DP-SGD (privacy_unit 'subject')")
    if placement.distributed:
        return ShardedPoissonSampler(len(dataset), dp.sample_rate, generator,
                                     rank=placement.rank, world_size=placement.world_size,
                                     public_size=public_size)
    return PoissonSampler(len(dataset), dp.sample_rate, generator, public_size=public_size)


def _prepare(spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
             base_model_dir: Path | None, resume_from: Path | None,
             generator: torch.Generator, rng: RngKind,
             dataset: ImageDataset | None = None,
             placement: Placement | None = None) -> _Run:
    """Load model and data, select trainable parameters, build the DP engine."""
    placement = placement if placement is not None else Placement()
    dp = spec.dp
    assert dp is not None  # TrainingSpec validation guarantees it for finetunes
    source = resume_from if resume_from is not None else base_model_dir
    if source is None:
        raise InvalidSpecError("a finetune needs base_model_dir or resume_from")
    bundle, info = load_model(source)
    # DP noise: a fresh OS key per engine (attempt) unless THIS attempt's generator was
    # injected by a test (docs/privacy.md, "The noise source"); decided before the override
    noise_generator = generator if rng == "test" else None
    if resume_from is not None and info.rng == "test":
        rng = "test"  # a model is "test" if any attempt in its history was seeded by a test
    start_step = _resume_step(resume_from, dp) if resume_from is not None else 0
    dataset = dataset if dataset is not None else load_dataset(dataset_path)
    data = model_and_data(spec, bundle, info, dataset, base_model_dir,
                           fresh=resume_from is None)
    info, latents, layouts, labels = data.info, data.latents, data.layouts, data.labels
    names, denoiser = data.names, data.denoiser
    fixed = _fixed_batch(spec, dp, placement)
    if spec.privacy_unit == "image":  # encoding costs N̂ records whatever the true count
        encode_blanks(bundle, info, real=len(dataset), masks=layouts is not None,
                      public=public_size(sample_rate=dp.sample_rate,
                                         expected_batch_size=dp.expected_batch_size))
    denoiser.to(placement.device)  # before the optimizer: its state lives with the params
    named = dict(denoiser.named_parameters())
    optimizer = torch.optim.AdamW([named[n] for n in names], lr=spec.learning_rate,
                                  weight_decay=0.0)
    if resume_from is not None:
        load_optimizer_state(optimizer, names, resume_from)
        _optimizer_state_to(optimizer, placement.device)
    # expected_batch_size is the GLOBAL E on every rank (the distributed engine divides the
    # all-reduced sum by it once).
    engine_class = DistributedDpSgdEngine if placement.distributed else DpSgdEngine
    engine = engine_class(denoiser, optimizer, noise_multiplier=dp.noise_multiplier,
                          max_grad_norm=dp.max_grad_norm,
                          expected_batch_size=dp.expected_batch_size,
                          generator=noise_generator)
    sampler = _sampler(spec, dp, dataset, generator, placement, fixed.population)
    # the ranks must sample the same N at the same q from the same step on (a resume of
    # the same checkpoint), or the union would not be the accounted Poisson sample
    if not same_on_all_ranks(placement, [dp.sample_rate, float(sampler.num_records),
                                         float(dp.steps), float(start_step),
                                         float(spec.noise_multiplicity)]):
        raise RuntimeError("the ranks disagree on the dataset size, q, steps or start step")
    return _Run(spec=spec, dp=dp, bundle=bundle, info=info, latents=latents, labels=labels,
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


def model_and_data(spec: TrainingSpec, bundle: ModelBundle, info: ModelInfo,
                    dataset: ImageDataset, base_model_dir: Path | None, *,
                    fresh: bool) -> ModelAndData:
    """Check spec/data/model, encode the examples, select the trainable parameters.

    Shared by the DP finetune and the non-private benchmark mode so both train exactly the
    same parameters on exactly the same examples.
    """
    # target "masks" (a layout generator): the private masks take the images' place, each
    # one its record's example under the same Poisson sampling and clipping.
    dataset = training_view(dataset, spec.target)
    info = _finetune_info(spec, info, dataset, base_model_dir, fresh=fresh)
    if fresh and spec.class_map is None:
        reset_class_embedder(bundle, spec.num_classes)  # new labels: a fresh class table
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


def _resume_step(resume_from: Path, dp: DpSpec) -> int:
    """Step to resume at; the checkpoint must come from a job with the same DpSpec."""
    state = read_trainer_state(resume_from)
    if state.get("kind") != "finetune" or state.get("dp") != _dp_record(dp):
        raise InvalidSpecError("checkpoint was written under a different DP spec")
    return int(state["step"])


def _finetune_info(spec: TrainingSpec, base: ModelInfo, dataset: ImageDataset,
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
    extra = dict(base.extra) if not fresh else {
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
                     steps=base.steps if not fresh else 0, extra=extra)


def _encode(bundle: ModelBundle, dataset: ImageDataset, info: ModelInfo) -> torch.Tensor:
    """Scaled VAE latents (posterior means) of all images; the VAE stays frozen."""
    if len(dataset) == 0:
        return _no_latents(bundle, info)
    return encode_images(bundle.vae, dataset.images, image_size=info.image_size,
                         channels=info.channels, scaling_factor=info.vae_scaling_factor)


def _no_latents(bundle: ModelBundle, info: ModelInfo) -> torch.Tensor:
    """Latents [0, C, h, w] of a dataset without records.

    A per-label class may hold no record (its declared size is public, its true count is
    not): its steps still run, each releasing pure noise and processing the same padded
    rows as a class with records (dp.padding); refusing would reveal the count. The shape
    comes from a blank image, not data.
    """
    blank = np.zeros((1, info.image_size, info.image_size, info.channels), dtype=np.uint8)
    return encode_images(bundle.vae, blank, image_size=info.image_size,
                         channels=info.channels, scaling_factor=info.vae_scaling_factor)[:0]


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
    return encode_images(bundle.vae, dataset.masks, image_size=info.image_size,
                         channels=info.channels, scaling_factor=info.vae_scaling_factor)


def _model_labels(dataset: ImageDataset, spec: TrainingSpec) -> torch.Tensor:
    """Private label indices mapped to model class indices."""
    labels = torch.from_numpy(dataset.labels)
    if not spec.class_conditional:
        return torch.full_like(labels, spec.num_classes)  # every example is the null class
    if spec.class_map is None:
        return labels
    table = torch.tensor([spec.class_map[i] for i in range(len(dataset.class_names))])
    return table[labels]


def _select_trainable(bundle: ModelBundle, spec: TrainingSpec) -> list[str]:
    """Set requires_grad per the spec (LoRA: inject adapters); return trainable names.

    See :mod:`dpsynth_ml.trainable` for the modes; names are ConditionalDenoiser names.
    """
    return apply_trainable(bundle, spec)


def _dp_record(dp: DpSpec) -> dict[str, float | int]:
    return {"noise_multiplier": dp.noise_multiplier, "sample_rate": dp.sample_rate,
            "expected_batch_size": dp.expected_batch_size,
            "max_grad_norm": dp.max_grad_norm, "steps": dp.steps}


def _trainer_state(run: _Run, step: int) -> dict[str, object]:
    """What the trainer actually used (read back by tests and by resume).

    ``step`` is the accountant's state: logical steps done over all attempts. No RNG state.
    """
    return {"kind": "finetune", "step": step, "dp": _dp_record(run.dp),
            "fixed_batch": run.fixed.record() if run.fixed is not None else None,
            "sampler": {"sample_rate": run.sampler.sample_rate,
                        "sample_rate_hex": float(run.sampler.sample_rate).hex(),
                        "num_records": run.sampler.num_records,
                        "draws_this_attempt": run.sampler.draws,
                        **_unit_record(run)},
            "start_step": run.start_step, "trainable_parameter_names": run.trainable_names,
            "noise_multiplicity": run.spec.noise_multiplicity,
            "lr_schedule": (schedule_state(run.lr_schedule)
                            if run.lr_schedule is not None else None),
            "ema": ({"decay": run.ema.decay, "optimization_step": run.ema.optimization_step}
                    if run.ema is not None else None)}


def _unit_record(run: _Run) -> dict[str, object]:
    """What the sampler ranges over: images, or subjects with the per-subject image cap."""
    if isinstance(run.sampler, (SubjectPoissonSampler, ShardedSubjectPoissonSampler)):
        return {"unit": "subject", "max_images_per_subject":
                run.sampler.max_images_per_subject}
    return {"unit": "image"}


def _attach_schedule_and_ema(run: _Run, resume_from: Path | None) -> None:
    """LR warm-up and EMA; on resume, restore raw weights, EMA and schedule exactly.

    The optimizer state is restored by ``_prepare``; the step count (the accountant's state)
    by ``_resume_step``. Randomness is never restored.
    """
    params = run.engine.params
    state = read_trainer_state(resume_from) if resume_from is not None else {}
    if resume_from is not None and (Path(resume_from) / TRAINABLE_FILE).is_file():
        # The checkpoint's model holds the released (EMA) weights; training resumes from
        # the raw ones.
        raw = load_named_tensors(run.trainable_names, Path(resume_from) / TRAINABLE_FILE)
        with torch.no_grad():
            for p, value in zip(params, raw, strict=True):
                p.copy_(value.to(p.device, p.dtype))
    run.lr_schedule = warmup_schedule(run.engine.optimizer.original_optimizer,
                                      run.spec.warmup_steps)
    if state.get("lr_schedule"):
        restore_schedule(run.lr_schedule, state["lr_schedule"])
    elif run.start_step:  # an older checkpoint: the schedule is a function of the step
        sched, done = run.lr_schedule, run.start_step
        restore_schedule(sched, {"last_epoch": done, "_step_count": done + 1, "_last_lr": [
            base * fn(done) for base, fn in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]})
    if run.spec.ema_decay is None:
        return
    run.ema = EMAModel(params, decay=run.spec.ema_decay)
    saved = state.get("ema")
    if resume_from is not None and saved and (Path(resume_from) / EMA_FILE).is_file():
        shadow = load_named_tensors(run.trainable_names, Path(resume_from) / EMA_FILE)
        run.ema.shadow_params = [s.to(p.device, p.dtype) for s, p in zip(shadow, params,
                                                                         strict=True)]
        run.ema.optimization_step = int(saved["optimization_step"])


@contextmanager
def _released_weights(run: _Run) -> Iterator[None]:
    """Inside the block the trainable parameters hold what is released (EMA if any)."""
    if run.ema is None:
        yield
        return
    params = run.engine.params
    run.ema.store(params)
    run.ema.copy_to(params)
    try:
        yield
    finally:
        run.ema.restore(params)


def _stamp(run: _Run, step: int) -> ModelInfo:
    extra = run.info.extra
    if run.fixed is not None:  # the timing channel's public cost (docs/privacy.md)
        extra = {**extra, "fixed_batch": run.fixed.record()}
    return dataclasses.replace(run.info, steps=step, rng=run.rng, extra=extra)


def _checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def _checkpoint(run: _Run, step: int, hooks: TrainingHooks) -> None:
    """Write model dir + trainer state + optimizer state, then tell the platform."""
    if run.placement.distributed and not isinstance(run.engine, DistributedDpSgdEngine):
        raise RuntimeError("a multi-rank run needs the distributed engine")
    if isinstance(run.engine, DistributedDpSgdEngine) and not run.engine.parameters_in_sync():
        # collective (every rank checkpoints at the same steps); a diverged replica must
        # never be released
        raise RuntimeError("the ranks' model copies have diverged")
    if not run.placement.is_main:
        return
    ckpt = run.out_dir / "checkpoints" / _checkpoint_name(step)
    with _released_weights(run):
        # LoRA: the checkpoint keeps the unmerged base + adapters so a resume continues
        # exactly; the released model (run_finetune) merges them.
        save_model(run.bundle, _stamp(run, step), ckpt, keep_adapters=True)
    write_trainer_state(ckpt, _trainer_state(run, step))
    save_optimizer_state(run.engine.optimizer.original_optimizer, run.trainable_names, ckpt)
    save_named_tensors(run.engine.params, run.trainable_names, ckpt / TRAINABLE_FILE)
    if run.ema is not None:
        save_named_tensors(run.ema.shadow_params, run.trainable_names, ckpt / EMA_FILE)
    hooks.on_checkpoint(step, ckpt)


# --- non-private mode (benchmarks only) ---------------------------------------------------


__all__: Sequence[str] = ["ModelAndData", "model_and_data", "run_finetune"]
