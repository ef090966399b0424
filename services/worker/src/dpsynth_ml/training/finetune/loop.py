"""The DP-SGD loop of a finetune: steps leased in chunks, each logical step Poisson-sampled,
padded to the fixed rows, cut into micro-batches, clipped per example (or per subject),
noised once and applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from dpsynth_ml.dp import SubjectPoissonSampler
from dpsynth_ml.dp.distributed import (
    ShardedSubjectPoissonSampler,
)
from dpsynth_ml.dp.padding import (
    gather_rows,
    mask_losses,
    pad_groups,
    pad_indices,
)
from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.training.finetune import checkpoints
from dpsynth_ml.training.hooks import TrainingHooks

if TYPE_CHECKING:
    from dpsynth_ml.training.finetune.setup import FinetuneRun


def train_loop(run: FinetuneRun, hooks: TrainingHooks) -> tuple[int, bool]:
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
            hooks.on_private_stats(logical_step(run))
            step += 1
            hooks.on_progress(step, total)
            if step % run.spec.checkpoint_every == 0 or step == total:
                checkpoints.checkpoint(run, step, hooks)
    return step, False


def logical_step(run: FinetuneRun) -> dict[str, float]:
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
        draw = _chunk_losses(run, chunk, real, latents, chunk_labels)
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


def _on_device(run: FinetuneRun, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A micro-batch's tensors on the model's device (no copy on the CPU)."""
    return tuple(t.to(run.placement.device) for t in tensors)


def _chunk_losses(run: FinetuneRun, chunk: torch.Tensor, real: torch.Tensor,
                  latents: torch.Tensor, labels: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One micro-batch's per-row loss draw (one diffusion draw per call, padding rows
    masked to 0): what the engine calls K times per example (noise_multiplicity)."""
    layout = (_on_device(run, gather_rows(run.layouts, chunk))[0]
              if run.layouts is not None else None)

    def draw() -> torch.Tensor:
        return mask_losses(per_sample_diffusion_loss(
            run.engine.module, run.bundle.scheduler, latents, labels, run.generator,
            layout=layout, timesteps=run.spec.timestep_distribution), real)

    return draw


def _noise_and_update(run: FinetuneRun) -> None:
    """Noise the clipped sum once, apply it, then advance the LR schedule and the EMA."""
    run.engine.privatize()
    run.engine.apply_update()
    if run.lr_schedule is not None:
        run.lr_schedule.step()
    if run.ema is not None:
        run.ema.step(run.engine.params)


def _subject_step(run: FinetuneRun, sampler: SubjectPoissonSampler | ShardedSubjectPoissonSampler,
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
        carry_in = start > 0 and bool(groups[start] == groups[start - 1])
        carry_out = end < total and bool(groups[end] == groups[end - 1])

        draw = _chunk_losses(run, chunk, real, latents, chunk_labels)
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
