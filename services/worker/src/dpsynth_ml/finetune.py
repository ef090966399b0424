"""DP fine-tuning of a pretrained latent diffusion model (DP-LDMs, Liu et al., TMLR 2024).

The VAE is frozen and only encodes the private images; the UNet's attention modules (or the
whole UNet) and, when labels are new, the class embedder are trained with DP-SGD (Abadi et
al. 2016; diffusion-specific practice from DPDM, Dockhorn et al.). Only the DP-trained UNet
and embedder depend on private data, so the released model is DP by post-processing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dpsynth_ml.checkpoint import (
    load_optimizer_state,
    read_trainer_state,
    save_optimizer_state,
    write_trainer_state,
)
from dpsynth_ml.data import ImageDataset, images_to_tensor, load_dataset
from dpsynth_ml.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.dp import DpSgdEngine, PoissonSampler
from dpsynth_ml.hooks import TrainingHooks
from dpsynth_ml.model_io import load_model, model_hash, save_model
from dpsynth_ml.models import (
    ConditionalDenoiser,
    ModelBundle,
    build_class_embedder,
    is_attention_parameter,
)
from dpsynth_ml.spec import (
    DpSpec,
    InvalidSpecError,
    ModelInfo,
    RngKind,
    TrainingResult,
    TrainingSpec,
)

_ENCODE_CHUNK = 256


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
    sampler: PoissonSampler
    trainable_names: list[str]
    generator: torch.Generator
    out_dir: Path
    start_step: int
    rng: RngKind


def run_finetune(spec: TrainingSpec, *, dataset_path: Path, out_dir: Path, hooks: TrainingHooks,
                 base_model_dir: Path | None, resume_from: Path | None,
                 generator: torch.Generator, rng: RngKind) -> TrainingResult:
    """Run (or resume) a DP finetune; see :func:`dpsynth_ml.train` for the contract."""
    run = _prepare(spec, dataset_path=dataset_path, out_dir=out_dir,
                   base_model_dir=base_model_dir, resume_from=resume_from,
                   generator=generator, rng=rng)
    step, stopped = _train_loop(run, hooks)
    run.engine.close()
    last = out_dir / "checkpoints" / _checkpoint_name(step)
    if step > run.start_step and not last.exists():
        _checkpoint(run, step, hooks)
    model_dir = save_model(run.bundle, _stamp(run, step), out_dir / "model")
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
    """One DP-SGD step: Poisson batch → micro-batches → clip/sum → noise once → update.

    Returns owner-only, non-DP statistics of the private batch.
    """
    indices = run.sampler.sample()
    null_class = run.info.null_class
    loss_sum, clipped = 0.0, 0
    # torch.split of an empty tensor yields one empty chunk; an empty Poisson batch has no
    # micro-batch at all (privatize() then releases pure noise).
    chunks = torch.split(indices, run.spec.max_physical_batch_size) if indices.numel() else ()
    for chunk in chunks:
        labels = drop_labels(run.labels[chunk], probability=run.spec.label_dropout,
                             null_class=null_class, generator=run.generator)
        losses = per_sample_diffusion_loss(run.engine.module, run.bundle.scheduler,
                                           run.latents[chunk], labels, run.generator)
        clipped += run.engine.accumulate(losses)
        loss_sum += float(losses.detach().sum())
    run.engine.privatize()
    run.engine.apply_update()
    size = int(indices.numel())
    stats = {"batch_size": float(size), "fraction_clipped": clipped / size if size else 0.0}
    if size:
        stats["loss"] = loss_sum / size
    return stats


def _prepare(spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
             base_model_dir: Path | None, resume_from: Path | None,
             generator: torch.Generator, rng: RngKind) -> _Run:
    """Load model and data, select trainable parameters, build the DP engine."""
    dp = spec.dp
    assert dp is not None  # TrainingSpec validation guarantees it for finetunes
    source = resume_from if resume_from is not None else base_model_dir
    if source is None:
        raise InvalidSpecError("a finetune needs base_model_dir or resume_from")
    bundle, info = load_model(source)
    if resume_from is not None and info.rng == "test":
        rng = "test"  # a model is "test" if any attempt in its history was seeded by a test
    start_step = _resume_step(resume_from, dp) if resume_from is not None else 0
    dataset = load_dataset(dataset_path)
    info = _finetune_info(spec, info, dataset, base_model_dir, fresh=resume_from is None)
    if resume_from is None and spec.class_map is None:
        bundle.class_embedder = build_class_embedder(
            spec.num_classes, bundle.class_embedder.embedding_dim)
    latents = _encode(bundle, dataset, info)
    labels = _model_labels(dataset, spec)
    names = _select_trainable(bundle, spec)
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).train()
    named = dict(denoiser.named_parameters())
    optimizer = torch.optim.AdamW([named[n] for n in names], lr=spec.learning_rate,
                                  weight_decay=0.0)
    if resume_from is not None:
        load_optimizer_state(optimizer, names, resume_from)
    engine = DpSgdEngine(denoiser, optimizer, noise_multiplier=dp.noise_multiplier,
                         max_grad_norm=dp.max_grad_norm,
                         expected_batch_size=dp.expected_batch_size, generator=generator)
    sampler = PoissonSampler(len(dataset), dp.sample_rate, generator)
    return _Run(spec=spec, dp=dp, bundle=bundle, info=info, latents=latents, labels=labels,
                engine=engine, sampler=sampler, trainable_names=names, generator=generator,
                out_dir=Path(out_dir), start_step=start_step, rng=rng)


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
    extra.update({"trainable": spec.trainable, "class_map_given": spec.class_map is not None})
    return ModelInfo(format_version=base.format_version, preset=base.preset,
                     image_size=base.image_size, channels=base.channels,
                     latent_channels=base.latent_channels,
                     vae_scaling_factor=base.vae_scaling_factor,
                     num_classes=spec.num_classes, class_names=tuple(class_names),
                     null_class=spec.num_classes, rng=base.rng, training_kind="finetune",
                     steps=base.steps if not fresh else 0, extra=extra)


def _encode(bundle: ModelBundle, dataset: ImageDataset, info: ModelInfo) -> torch.Tensor:
    """Scaled VAE latents (posterior means) of all images; the VAE stays frozen."""
    bundle.vae.requires_grad_(False).eval()
    chunks = []
    with torch.no_grad():
        for start in range(0, len(dataset), _ENCODE_CHUNK):
            x = images_to_tensor(dataset.images[start:start + _ENCODE_CHUNK],
                                 image_size=info.image_size, channels=info.channels)
            chunks.append(bundle.vae.encode(x).latent_dist.mean * info.vae_scaling_factor)
    if not chunks:
        raise InvalidSpecError("the dataset is empty")
    return torch.cat(chunks)


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
    """Set requires_grad per the spec; return trainable names (ConditionalDenoiser naming)."""
    for name, param in bundle.unet.named_parameters():
        param.requires_grad_(spec.trainable == "full" or is_attention_parameter(name))
    bundle.class_embedder.requires_grad_(spec.class_map is None)
    names = [f"unet.{n}" for n, p in bundle.unet.named_parameters() if p.requires_grad]
    if spec.class_map is None:
        names.append("class_embedder.weight")
    return names


def _dp_record(dp: DpSpec) -> dict[str, float | int]:
    return {"noise_multiplier": dp.noise_multiplier, "sample_rate": dp.sample_rate,
            "expected_batch_size": dp.expected_batch_size,
            "max_grad_norm": dp.max_grad_norm, "steps": dp.steps}


def _trainer_state(run: _Run, step: int) -> dict[str, object]:
    """What the trainer actually used (read back by tests and by resume)."""
    return {"kind": "finetune", "step": step, "dp": _dp_record(run.dp),
            "sampler": {"sample_rate": run.sampler.sample_rate,
                        "sample_rate_hex": float(run.sampler.sample_rate).hex(),
                        "num_records": run.sampler.num_records,
                        "draws_this_attempt": run.sampler.draws},
            "start_step": run.start_step, "trainable_parameter_names": run.trainable_names}


def _stamp(run: _Run, step: int) -> ModelInfo:
    return dataclasses.replace(run.info, steps=step, rng=run.rng)


def _checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def _checkpoint(run: _Run, step: int, hooks: TrainingHooks) -> None:
    """Write model dir + trainer state + optimizer state, then tell the platform."""
    ckpt = run.out_dir / "checkpoints" / _checkpoint_name(step)
    save_model(run.bundle, _stamp(run, step), ckpt)
    write_trainer_state(ckpt, _trainer_state(run, step))
    save_optimizer_state(run.engine.optimizer.original_optimizer, run.trainable_names, ckpt)
    hooks.on_checkpoint(step, ckpt)


__all__: Sequence[str] = ["run_finetune"]
