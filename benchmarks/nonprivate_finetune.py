"""Finetuning WITHOUT privacy: the baseline the benchmarks compare DP-SGD with.

It lives here, not in the ML core: no spec, API field or setting of the product can turn DP
off. It shares the core's :func:`dpsynth_ml.training.finetune.model_and_data` (base model, examples,
trainable set) with the DP finetune and differs only in what DP-SGD adds (see
:func:`run_nonprivate_finetune`); :func:`train_nonprivate` is its entry point, shaped like
:func:`dpsynth_ml.train`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.training_utils import EMAModel
from dpsynth_ml.data import load_dataset
from dpsynth_ml.models.architectures import ModelBundle
from dpsynth_ml.models.model_io import load_model, save_model
from dpsynth_ml.spec import FinetuneRecipe, InvalidSpecError, RngKind, TrainingResult
from dpsynth_ml.training.checkpoint import warmup_schedule, write_trainer_state
from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.training.finetune import ModelAndData, model_and_data
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks


@dataclass(frozen=True, kw_only=True)
class NonprivateFinetune(FinetuneRecipe):
    """A finetune's recipe trained without privacy: ``epochs`` of uniformly shuffled
    minibatches of ``batch_size``, seeded by ``seed``. Not a ``dpsynth_ml.TrainingSpec``:
    :func:`dpsynth_ml.train` does not accept it."""

    batch_size: int = 64
    epochs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.epochs, self.batch_size) < 1:
            raise InvalidSpecError("epochs and batch_size must be >= 1")


def train_nonprivate(spec: NonprivateFinetune, *, dataset_path: Path, out_dir: Path,
                     base_model_dir: Path | None, hooks: TrainingHooks = NullHooks(),
                     _test_generator: torch.Generator | None = None) -> TrainingResult:
    """Finetune without privacy on the CPU, seeded by ``spec.seed`` (or by the injected
    generator, then stamped ``rng: "test"``); see :func:`run_nonprivate_finetune`."""
    rng: RngKind = "test" if _test_generator is not None else "os"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seeded = torch.Generator().manual_seed(spec.seed)
    return run_nonprivate_finetune(
        spec, dataset_path=Path(dataset_path), out_dir=out_dir, hooks=hooks,
        base_model_dir=base_model_dir, rng=rng,
        generator=_test_generator if _test_generator is not None else seeded)


def run_nonprivate_finetune(spec: NonprivateFinetune, *, dataset_path: Path, out_dir: Path,
                            hooks: TrainingHooks, base_model_dir: Path | None,
                            generator: torch.Generator, rng: RngKind) -> TrainingResult:
    """Finetune WITHOUT privacy: the baseline benchmarks compare DP-SGD with.

    The same base model, examples, trainable set (``model_and_data``), diffusion loss,
    label dropout, K draws, AdamW, warm-up and EMA as :func:`run_finetune`; what differs is
    only what DP-SGD adds: each epoch is a uniform shuffle cut into minibatches of
    ``spec.batch_size`` (the last one may be smaller), and the update is the plain gradient
    of the minibatch's mean loss (micro-batches of ``max_physical_batch_size`` accumulate
    into ``p.grad``): no per-example gradients, no clipping, no noise. ``hooks.acquire_steps``
    is still asked for every chunk of ``checkpoint_every`` steps so a stop or a refusal is
    honoured, but no checkpoint is written and a resume is not supported.

    Returns:
        The result; the model's info carries ``extra["nonprivate"] = True``.
    """
    if base_model_dir is None:
        raise InvalidSpecError("a finetune needs base_model_dir")
    bundle, base_info = load_model(base_model_dir)
    data = model_and_data(spec, bundle, base_info, load_dataset(dataset_path), base_model_dir,
                           fresh=True)
    info = dataclasses.replace(data.info, extra={**data.info.extra, "nonprivate": True})
    named = dict(data.denoiser.named_parameters())
    params = [named[n] for n in data.names]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    schedule = warmup_schedule(optimizer, spec.warmup_steps)
    ema = EMAModel(params, decay=spec.ema_decay) if spec.ema_decay is not None else None
    size = int(data.latents.shape[0])
    total = spec.epochs * math.ceil(size / spec.batch_size)
    batches = _shuffled_batches(size, spec.batch_size, generator)
    step, stopped = 0, False
    while step < total and not stopped:
        wanted = min(spec.checkpoint_every, total - step)
        granted = 0 if hooks.should_stop() else max(0, min(int(hooks.acquire_steps(
            step, wanted)), wanted))
        stopped = granted == 0
        for i in range(granted):
            if i > 0 and hooks.should_stop():
                stopped = True
                break
            hooks.on_private_stats(_nonprivate_step(spec, data, bundle, next(batches),
                                                    optimizer, generator))
            schedule.step()
            if ema is not None:
                ema.step(params)
            step += 1
            hooks.on_progress(step, total)
    if ema is not None:
        ema.copy_to(params)  # the EMA is what is released, as in the DP finetune
    model_dir = save_model(bundle, dataclasses.replace(info, steps=step, rng=rng),
                           out_dir / "model")
    write_trainer_state(out_dir, {"kind": "finetune", "nonprivate": True, "step": step,
                                  "batch_size": spec.batch_size, "epochs": spec.epochs,
                                  "trainable_parameter_names": data.names})
    return TrainingResult(steps_completed=step, stopped_early=stopped, model_dir=model_dir,
                          trainable_parameters=sum(p.numel() for p in params),
                          total_parameters=bundle.parameter_count(), rng=rng)


def _shuffled_batches(size: int, batch_size: int,
                      generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless epochs: a fresh uniform permutation each epoch, cut into ``batch_size``."""
    while size:
        order = torch.randperm(size, generator=generator)
        yield from torch.split(order, batch_size)


def _nonprivate_step(spec: NonprivateFinetune, data: ModelAndData, bundle: ModelBundle,
                     indices: torch.Tensor, optimizer: torch.optim.Optimizer,
                     generator: torch.Generator) -> dict[str, float]:
    """One plain minibatch step on the mean (over examples and K draws) diffusion loss."""
    labels = drop_labels(data.labels[indices], probability=spec.label_dropout,
                         null_class=data.info.null_class, generator=generator)
    size, loss_sum = int(indices.numel()), 0.0
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, size, spec.max_physical_batch_size):
        chunk = indices[start:start + spec.max_physical_batch_size]
        chunk_labels = labels[start:start + spec.max_physical_batch_size]
        layout = data.layouts[chunk] if data.layouts is not None else None
        for _ in range(spec.noise_multiplicity):
            losses = per_sample_diffusion_loss(data.denoiser, bundle.scheduler,
                                               data.latents[chunk], chunk_labels, generator,
                                               layout=layout)
            loss = losses.sum() / (size * spec.noise_multiplicity)
            loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward
            loss_sum += float(losses.detach().sum()) / spec.noise_multiplicity
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"batch_size": float(size), "loss": loss_sum / size}


__all__: Sequence[str] = ["NonprivateFinetune", "run_nonprivate_finetune", "train_nonprivate"]
