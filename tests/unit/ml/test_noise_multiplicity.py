"""Noise multiplicity K (DPDM Alg. 1): K draws averaged per example, then ONE clip.

Engine tests use a tiny real UNet in float64 with fixed per-example draws (dp_support); the
trainer test counts the rows that reach the denoiser.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.training.finetune import loop as ft_loop

from .dp_support import (
    ZeroNoise,
    clip_rows,
    examples,
    make_engine,
    noisy_sum,
    one_thread,
    reference_grads,
    tiny_denoiser,
)
from .support import RecordingHooks, finetune_spec, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]


@pytest.mark.parametrize("draws", [1, 4])
def test_clipped_gradient_is_clip_of_the_mean_of_k_draws(draws: int) -> None:
    model = tiny_denoiser()
    ex = examples(4, draws)
    rows = torch.arange(len(ex))
    ref = reference_grads(model, ex, rows, draws)  # [n, K, P], plain autograd per example
    clip = 0.3 * float(ref.mean(dim=1).norm(dim=-1).median())  # some clipped, some not
    expected = clip_rows(ref.mean(dim=1), clip)  # clip(mean_k g_ik) per example
    assert (ref.mean(dim=1).norm(dim=-1) > clip).any()
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=1)
    for i in rows.tolist():  # each example alone: its released "sum" is its clipped grad
        one = noisy_sum(engine, ex, torch.tensor([i]), draws=draws, micro=1)
        torch.testing.assert_close(one, expected[i], rtol=1e-9, atol=1e-12)
    together = noisy_sum(engine, ex, rows, draws=draws, micro=len(ex))
    torch.testing.assert_close(together, expected.sum(dim=0), rtol=1e-9, atol=1e-12)
    if draws > 1:
        # Clipping the K rows separately (sensitivity K*C) gives a different, wrong sum.
        per_row = clip_rows(ref, clip).sum(dim=1).sum(dim=0)
        assert (per_row - together).norm() > 0.1 * clip


@pytest.mark.parametrize("draws", [1, 4])
def test_removing_one_example_moves_the_clipped_sum_by_at_most_c(draws: int) -> None:
    model = tiny_denoiser()
    ex = examples(4, draws, seed=11)
    rows = torch.arange(len(ex))
    clip = 0.5 * float(reference_grads(model, ex, rows[:2], draws).mean(dim=1)
                       .norm(dim=-1).min())  # clipping is active
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=3)
    full = noisy_sum(engine, ex, rows, draws=draws, micro=2)
    moved = [float((full - noisy_sum(engine, ex, rows[rows != i], draws=draws, micro=2)).norm())
             for i in rows.tolist()]
    assert max(moved) <= clip + 1e-9
    assert max(moved) > 0.999 * clip  # the bound is attained: the clipped examples move by C


def test_noise_std_is_sigma_times_c_with_multiplicity() -> None:
    sigma, clip, draws, repeats = 0.8, 0.05, 4, 12
    model = tiny_denoiser()
    ex = examples(3, draws, seed=3)
    rows = torch.arange(len(ex))
    noiseless = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=3)
    clean = noisy_sum(noiseless, ex, rows, draws=draws, micro=2)
    noiseless.close()
    engine = make_engine(model, sigma=sigma, clip=clip, expected=3, seed=42)
    noise = torch.stack([noisy_sum(engine, ex, rows, draws=draws, micro=2) - clean
                         for _ in range(repeats)])
    n, target = noise.numel(), sigma * clip
    # Standard error of a sample std of n Gaussians: sigma / sqrt(2 (n - 1)).
    assert abs(noise.std().item() - target) < 5 * target / math.sqrt(2 * (n - 1))
    assert abs(noise.mean().item()) < 5 * target / math.sqrt(n)
    # Not K times the noise, nor noise per draw: one N(0, sigma^2 C^2) per coordinate.
    assert noise.std().item() < 1.2 * target


def test_k_draws_happen_only_for_the_included_examples(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    draws, calls = 4, []
    real = ft_loop.per_sample_diffusion_loss

    def counting(denoiser, scheduler, latents, labels, generator,  # type: ignore[no-untyped-def]
                 **kwargs):
        losses = real(denoiser, scheduler, latents, labels, generator, **kwargs)
        calls.append((latents.detach().clone(), labels.clone(), losses.detach().clone()))
        return losses

    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", counting)
    hooks = RecordingHooks()
    spec = finetune_spec(noise_multiplicity=draws, dp_steps=3, dp_sample_rate=0.08,
                         max_physical_batch_size=3, checkpoint_every=3)
    train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
          base_model_dir=pretrained.model_dir, _test_generator=seeded(5))
    sizes = [int(s["batch_size"]) for s in hooks.private_stats]
    rows = [int(s["rows"]) for s in hooks.private_stats]
    assert sum(sizes) > 0
    assert len(set(rows)) == 1 and rows[0] > max(sizes)  # fixed rows per step (dp.padding)
    # Every non-padding forward row is an included example: K rows per example, none for
    # the others; padding rows (all-zero latents, loss masked to 0) fill each step to R.
    assert sum(len(latents) for latents, _, _ in calls) == draws * sum(rows)
    assert sum(int(latents.flatten(1).abs().amax(1).gt(0).sum())
               for latents, _, _ in calls) == draws * sum(sizes)
    micro_batches = sum(math.ceil(r / 3) for r in rows)
    assert len(calls) == draws * micro_batches
    for start in range(0, len(calls), draws):
        group = calls[start:start + draws]
        # The K draws of a micro-batch: same examples, same (dropped) labels, fresh noise.
        assert all(torch.equal(g[0], group[0][0]) and torch.equal(g[1], group[0][1])
                   for g in group)
        assert len({tuple(g[2].tolist()) for g in group}) == draws


def test_per_sample_gradients_stay_one_row_per_example_whatever_k() -> None:
    # Memory: after each of the K passes the per-sample gradients are folded into one
    # [b, ...] tensor per parameter (never K*b rows, never a growing list of K tensors).
    draws, model = 6, tiny_denoiser()
    ex = examples(3, draws)
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=1.0, expected=3)
    shapes: list[list[tuple[int, ...]]] = []
    fold = engine._fold_grad_samples

    def recording_fold() -> None:
        fold()
        shapes.append([tuple(p.grad_sample.shape) for p in engine.params])

    engine._fold_grad_samples = recording_fold  # type: ignore[method-assign]
    noisy_sum(engine, ex, torch.arange(3), draws=draws, micro=3)
    assert len(shapes) == draws
    assert all(s[0] == 3 and s[1:] == tuple(p.shape)
               for passes in shapes for s, p in zip(passes, engine.params, strict=True))
