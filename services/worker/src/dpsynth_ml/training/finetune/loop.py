"""The DP-SGD loop of a finetune: steps leased in chunks, each logical step Poisson-sampled,
padded to the fixed rows, cut into micro-batches, clipped per example (or per subject),
noised once and applied."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from dpsynth_ml.dp import BookKeepingEngine, SubjectPoissonSampler
from dpsynth_ml.dp.distributed import (
    ShardedSubjectPoissonSampler,
)
from dpsynth_ml.dp.padding import (
    PaddedRows,
    gather_rows,
    mask_losses,
    pad_groups,
    pad_indices,
)
from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss
from dpsynth_ml.training.finetune import checkpoints
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.training.leases import leased_steps

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from dpsynth_ml.training.finetune.setup import FinetuneRun


def train_loop(run: FinetuneRun, hooks: TrainingHooks) -> tuple[int, bool]:
    """Lease steps in chunks of ``checkpoint_every``; return (steps done, stopped early)."""
    return leased_steps(total=run.dp.steps, start=run.start_step,
                        every=run.spec.checkpoint_every, hooks=hooks,
                        step=lambda: logical_step(run),
                        checkpoint=lambda step: checkpoints.checkpoint(run, step, hooks))


def logical_step(run: FinetuneRun) -> dict[str, float]:
    """One DP-SGD step: :func:`accumulate_step` (Poisson batch → padded rows →
    micro-batches → clipped sum), then the noise once and the update. Returns owner-only,
    non-DP statistics."""
    stats = accumulate_step(run)
    _noise_and_update(run)
    return stats


def accumulate_step(run: FinetuneRun) -> dict[str, float]:
    """The private half of one logical step: Poisson batch → padded to the fixed rows →
    micro-batches → each example (or subject) clipped and added to the engine's sum.
    Nothing is noised or applied (:func:`logical_step` does it next; the white-box audit
    adds its gradient canaries in between, ``dpsynth_ml.audit``).

    Only the examples of the Poisson batch are drawn for (label dropout, K diffusion draws);
    the rest of the dataset is not touched. Padding rows (zero latents and layouts, the null
    label) go through the same passes with their loss multiplied by 0, so their gradient is
    exactly 0 and the clipped sum is the unpadded one (dp.padding). Returns owner-only,
    non-DP statistics.

    A record-level step that runs out of accelerator memory is redone on the SAME Poisson
    batch with half the micro-batch size (down to 1; :func:`_smaller_micro_batches`): the
    unreleased partial sums are discarded, nothing was noised or applied, and the clipped
    sum does not depend on how the rows are cut, so the released step is the accounted
    mechanism's. The rows and micro-batch shapes are fixed by public quantities (the padded
    rows), so whether a size fits does not depend on the private data.
    """
    if isinstance(run.sampler, (SubjectPoissonSampler, ShardedSubjectPoissonSampler)):
        return _subject_batches(run, run.sampler)
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
    while True:
        try:
            stats = _record_micro_batches(run, rows, labels)
            break
        except torch.cuda.OutOfMemoryError:
            if not _smaller_micro_batches(run):
                raise
    size = int(indices.numel())
    out = {"batch_size": float(size), "rows": float(len(rows)),
           "fraction_clipped": stats["clipped"] / size if size else 0.0}
    if "loss" in stats:
        out["loss"] = stats["loss"]
    return out


def micro_batch_size(run: FinetuneRun) -> int:
    """The micro-batch size in use (the spec's, or what an out-of-memory left)."""
    return run.physical_batch or run.spec.max_physical_batch_size


def _smaller_micro_batches(run: FinetuneRun) -> bool:
    """After an out-of-memory error in a record-level step: discard the step's unreleased
    state, halve the micro-batch size for the rest of the run and say so; False (the error
    stands) on several ranks (they would fall out of step), at size 1, or with the opacus
    hooks engine."""
    size = micro_batch_size(run)
    # only the book-keeping engine (every preset's) drops a failed pass cleanly: it clears
    # its kept records on any error; opacus' hooks would keep stale activations
    if run.placement.distributed or size <= 1 or not isinstance(run.engine, BookKeepingEngine):
        return False
    run.engine.discard()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    run.physical_batch = max(1, size // 2)
    log.warning("out of accelerator memory: micro-batches of %d rows instead of %d for the "
                "rest of this run (the same mechanism: only the cut of each logical batch "
                "changes)", run.physical_batch, size)
    return True


def _record_micro_batches(run: FinetuneRun, rows: PaddedRows,
                          labels: torch.Tensor) -> dict[str, float]:
    """Clip and sum one record-level logical batch (``rows``, its dropped ``labels``) in
    micro-batches of :func:`micro_batch_size` rows; nothing is noised or applied here.
    Returns the number of clipped examples and, with any real row, the mean loss."""
    size, step_size = int(rows.real.sum()), micro_batch_size(run)
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
    stats = {"clipped": float(clipped)}
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
    apply_private_gradient(run)


def apply_private_gradient(run: FinetuneRun) -> None:
    """Apply the private gradient the engine released, then advance the LR schedule and
    the EMA (the second half of :func:`_noise_and_update`)."""
    run.engine.apply_update()
    if run.lr_schedule is not None:
        run.lr_schedule.step()
    if run.ema is not None:
        run.ema.step(run.engine.params)


def _subject_batches(run: FinetuneRun,
                     sampler: SubjectPoissonSampler | ShardedSubjectPoissonSampler,
                     ) -> dict[str, float]:
    """The private half of one user-level DP-SGD step: Poisson over subjects → each sampled
    subject's (capped) images → per-example gradients (K draws each) → ONE clipped
    contribution per subject (the mean of its images' gradients), added to the sum.

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
    subjects = batch.num_subjects
    stats = {"batch_size": float(subjects), "images": float(size), "rows": float(total),
             "fraction_clipped": clipped / subjects if subjects else 0.0}
    if size:
        stats["loss"] = loss_sum / size
    return stats
