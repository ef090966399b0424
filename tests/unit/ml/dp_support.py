"""A tiny real UNet denoiser in float64 with explicit per-example diffusion draws.

The engine tests need the draws (timestep, noise) of every example fixed up front, so that
the same example gets the same draws however the logical batch is split or which other
examples are in it; the loss is then a deterministic function of (example, draw index).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel
from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.dp.noise import NoiseKind, NoiseSource
from torch import nn

LATENT_CHANNELS, LATENT_SIZE, NUM_CLASSES, CONTEXT = 2, 4, 3, 8


@pytest.fixture()
def one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from threads; on a loaded 2-core machine two OpenMP threads
    per process spin-wait and run these tests ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class TinyDenoiser(nn.Module):
    """UNet2DConditionModel + class embedder, as the trainer's ConditionalDenoiser."""

    def __init__(self) -> None:
        super().__init__()
        self.unet = UNet2DConditionModel(
            sample_size=LATENT_SIZE, in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS, layers_per_block=1, block_out_channels=(8, 16),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            mid_block_type="UNetMidBlock2DCrossAttn", cross_attention_dim=CONTEXT,
            attention_head_dim=4, norm_num_groups=4)
        self.class_embedder = nn.Embedding(NUM_CLASSES + 1, CONTEXT)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        context = self.class_embedder(labels).unsqueeze(1)
        out = self.unet(latents, timesteps, encoder_hidden_states=context, return_dict=False)
        return out[0]  # type: ignore[no-any-return]


def tiny_denoiser(*, attention_only: bool = True) -> TinyDenoiser:
    """A float64 denoiser; by default only attention + embedder are trainable (DP-LDMs)."""
    torch.manual_seed(0)
    model = TinyDenoiser().double().train()
    for name, p in model.unet.named_parameters():
        parts = name.split(".")
        p.requires_grad_(not attention_only or "attn1" in parts or "attn2" in parts)
    return model


@dataclass(frozen=True)
class Examples:
    """n examples with K fixed (timestep, noise) draws each."""

    latents: torch.Tensor  # [n, c, h, w]
    labels: torch.Tensor  # [n]
    timesteps: torch.Tensor  # [n, K]
    noise: torch.Tensor  # [n, K, c, h, w]

    def __len__(self) -> int:
        return int(self.latents.shape[0])


def examples(n: int, draws: int, seed: int = 7) -> Examples:
    g = torch.Generator().manual_seed(seed)
    shape = (LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE)
    return Examples(latents=torch.randn((n, *shape), generator=g, dtype=torch.float64) * 2,
                    labels=torch.randint(0, NUM_CLASSES + 1, (n,), generator=g),
                    timesteps=torch.randint(0, 1000, (n, draws), generator=g),
                    noise=torch.randn((n, draws, *shape), generator=g, dtype=torch.float64))


SCHEDULER = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4,
                          beta_end=0.02, prediction_type="epsilon", clip_sample=False)


def draw_loss(module: nn.Module, ex: Examples, rows: torch.Tensor, k: int) -> torch.Tensor:
    """Per-example epsilon-prediction loss of ``rows`` at their k-th fixed draw."""
    t, noise = ex.timesteps[rows, k], ex.noise[rows, k]
    noisy = SCHEDULER.add_noise(ex.latents[rows], noise, t)
    return (module(noisy, t, ex.labels[rows]) - noise).pow(2).flatten(1).mean(dim=1)


@dataclass
class ZeroNoise:
    """A DELIBERATELY BROKEN noise source (test code only): it adds no noise at all, so a
    test can compare the clipped sum exactly. The product cannot build one: no spec allows
    sigma = 0, and only an injected object (``DpSgdEngine(_test_noise=...)``) replaces the
    ChaCha20 source."""

    kind: NoiseKind = "test"
    draws: int = 0

    def gaussian(self, shape: torch.Size | tuple[int, ...], std: float, *,
                 device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self.draws += 1
        return torch.zeros(shape, device=device, dtype=dtype)


def make_engine(model: nn.Module, *, sigma: float, clip: float, expected: int,
                seed: int = 0, noise: NoiseSource | None = None) -> DpSgdEngine:
    """An engine with a seeded (replayable) noise key, or the injected ``noise`` source."""
    params = [p for p in model.parameters() if p.requires_grad]
    return DpSgdEngine(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma,
                       max_grad_norm=clip, expected_batch_size=expected,
                       generator=torch.Generator().manual_seed(seed), _test_noise=noise)


def noisy_sum(engine: DpSgdEngine, ex: Examples, rows: torch.Tensor, *, draws: int,
              micro: int) -> torch.Tensor:
    """One logical step over ``rows`` in micro-batches, without updating.

    Returns:
        The released sum (clipped per-example K-draw means + noise), flattened.
    """
    for start in range(0, len(rows), micro):
        chunk = rows[start:start + micro]
        counter = iter(range(draws))
        engine.accumulate_draws(lambda chunk=chunk, c=counter: draw_loss(  # type: ignore[misc]
            engine.module, ex, chunk, next(c)), draws)
    engine.privatize()
    flat = torch.cat([p.grad.detach().flatten() for p in engine.params])
    engine.discard()
    return flat * engine.optimizer.expected_batch_size


def reference_grads(model: nn.Module, ex: Examples, rows: torch.Tensor,
                    draws: int) -> torch.Tensor:
    """Per-example, per-draw gradients [len(rows), K, P] by plain autograd (no opacus)."""
    plain = copy.deepcopy(model)
    params = [p for p in plain.parameters() if p.requires_grad]
    out = []
    for i in rows.tolist():
        per_draw = []
        for k in range(draws):
            loss = draw_loss(plain, ex, torch.tensor([i]), k).sum()
            per_draw.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
        out.append(torch.stack(per_draw))
    return torch.stack(out)


def clip_rows(grads: torch.Tensor, clip: float) -> torch.Tensor:
    """opacus' clipping: g * min(1, C / (||g|| + 1e-6)) per row."""
    factors = (clip / (grads.norm(dim=-1, keepdim=True) + 1e-6)).clamp(max=1.0)
    return grads * factors
