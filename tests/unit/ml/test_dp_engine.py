"""Clipping, noise and normalisation of the DP-SGD engine (Abadi et al. 2016, Alg. 1)."""

from __future__ import annotations

import math

import pytest
import torch
from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.dp.noise import NoiseSource
from torch import nn

from .dp_support import ZeroNoise

DIM_IN, DIM_OUT = 6, 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Linear + GroupNorm + Embedding: the layer types the UNet's DP path relies on.
    return nn.Sequential(nn.Linear(DIM_IN, 8), nn.GroupNorm(2, 8), nn.SiLU(),
                         nn.Linear(8, DIM_OUT))


def _engine(model: nn.Module, *, sigma: float, clip: float, expected: int,
            generator: torch.Generator | None = None,
            noise: NoiseSource | None = None) -> DpSgdEngine:
    params = [p for p in model.parameters() if p.requires_grad]
    return DpSgdEngine(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma,
                       max_grad_norm=clip, expected_batch_size=expected,
                       generator=generator or torch.Generator().manual_seed(0),
                       _test_noise=noise)


def _batch(n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, DIM_IN, generator=g) * 3, torch.randn(n, DIM_OUT, generator=g) * 3


def _per_sample_loss(engine: DpSgdEngine, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (engine.module(x) - y).pow(2).sum(dim=1)


def _private_sum(engine: DpSgdEngine, x: torch.Tensor, y: torch.Tensor,
                 micro: int = 2) -> torch.Tensor:
    """Run one logical step without updating; return (noisy clipped sum) as a flat vector."""
    for start in range(0, len(x), micro):
        engine.accumulate(_per_sample_loss(engine, x[start:start + micro], y[start:start + micro]))
    engine.privatize()
    flat = torch.cat([p.grad.detach().flatten() for p in engine.params])
    engine.discard()
    return flat * engine.optimizer.expected_batch_size


def _true_per_sample_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        (model(x[i:i + 1]) - y[i:i + 1]).pow(2).sum().backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad()
    return torch.stack(rows)


def test_each_clipped_example_has_norm_at_most_c() -> None:
    clip = 0.05
    model = _model()
    x, y = _batch()
    raw_norms = _true_per_sample_grads(model, x, y).norm(dim=1)
    assert (raw_norms > 10 * clip).all()  # so clipping is really exercised
    engine = _engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=1)
    for i in range(len(x)):
        clipped = _private_sum(engine, x[i:i + 1], y[i:i + 1])
        assert clipped.norm() <= clip + 1e-6
        assert clipped.norm() > 0.99 * clip  # clipped to C, not zeroed


def test_clipped_sum_matches_manual_clipping_and_is_normalised_by_expected_size() -> None:
    clip, expected = 0.5, 10
    model = _model()
    x, y = _batch(3)
    grads = _true_per_sample_grads(model, x, y)
    factors = (clip / (grads.norm(dim=1) + 1e-6)).clamp(max=1.0)
    manual = (grads * factors[:, None]).sum(dim=0)
    engine = _engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=expected)
    engine.accumulate(_per_sample_loss(engine, x, y))
    engine.privatize()
    grad = torch.cat([p.grad.flatten() for p in engine.params])
    # Divided by the public expected batch size (10), not by the realised size (3).
    torch.testing.assert_close(grad, manual / expected, rtol=1e-4, atol=1e-6)


def test_removing_one_example_moves_clipped_sum_by_at_most_c() -> None:
    clip = 0.3
    model = _model()
    x, y = _batch(6)
    engine = _engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=4)
    full = _private_sum(engine, x, y)
    for i in range(len(x)):
        keep = [j for j in range(len(x)) if j != i]
        without = _private_sum(engine, x[keep], y[keep])
        assert (full - without).norm() <= clip + 1e-5


def test_noise_on_summed_gradient_has_std_sigma_c() -> None:
    sigma, clip, draws = 0.8, 0.5, 120
    model = _model()
    x, y = _batch(5)
    noiseless = _engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=5)
    clean = _private_sum(noiseless, x, y)
    noiseless.close()
    engine = _engine(model, sigma=sigma, clip=clip, expected=5,
                     generator=torch.Generator().manual_seed(42))
    noise = torch.stack([_private_sum(engine, x, y) - clean for _ in range(draws)]).double()
    n = noise.numel()
    target = sigma * clip
    std = noise.std().item()
    # Standard error of a sample std of n Gaussians: sigma / sqrt(2 (n - 1)).
    assert abs(std - target) < 5 * target / math.sqrt(2 * (n - 1))
    assert abs(noise.mean().item()) < 5 * target / math.sqrt(n)
    # Independent across draws: the same seed would give identical noise.
    assert not torch.equal(noise[0], noise[1])


def test_empty_logical_batch_is_pure_noise() -> None:
    sigma, clip, expected = 1.0, 2.0, 8
    model = _model()
    engine = _engine(model, sigma=sigma, clip=clip, expected=expected)
    before = [p.detach().clone() for p in engine.params]
    engine.privatize()  # no micro-batch at all
    grads = torch.cat([p.grad.flatten() for p in engine.params]) * expected
    assert grads.abs().sum() > 0
    assert abs(grads.std().item() - sigma * clip) < 5 * sigma * clip / math.sqrt(2 * grads.numel())
    engine.apply_update()
    assert any(not torch.equal(b, p) for b, p in zip(before, engine.params))


def test_noise_cannot_be_turned_off_by_a_spec_or_an_argument() -> None:
    """sigma = 0 is refused by the spec and by the engine: a noiseless mechanism exists only
    as an object test code injects (``_test_noise``, e.g. dp_support.ZeroNoise)."""
    from dpsynth_ml import DpSpec, InvalidSpecError

    for sigma in (0.0, -1.0):
        with pytest.raises(InvalidSpecError, match="noise_multiplier"):
            DpSpec(noise_multiplier=sigma, sample_rate=0.1, expected_batch_size=4,
                   max_grad_norm=1.0, steps=1)
        with pytest.raises(ValueError, match="noise_multiplier"):
            _engine(_model(), sigma=sigma, clip=1.0, expected=4)
