"""Pure helpers of the epsilon-prediction diffusion objective (Ho et al. 2020)."""

from __future__ import annotations

import math
from typing import cast

import torch
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler

from dpsynth_ml.models.architectures import ConditionalDenoiser
from dpsynth_ml.spec import TimestepDistribution


def drop_labels(labels: torch.Tensor, *, probability: float, null_class: int,
                generator: torch.Generator) -> torch.Tensor:
    """Replace each label by ``null_class`` with ``probability`` (classifier-free guidance).

    Each example's replacement is drawn independently, so an example's gradient still
    depends on that example alone (required for per-example clipping).
    """
    if probability <= 0 or labels.numel() == 0:
        return labels
    drop = torch.rand(labels.shape, generator=generator) < probability
    return torch.where(drop, torch.full_like(labels, null_class), labels)


# How training timesteps are drawn (TimestepDistribution): ``uniform`` over the scheduler's
# steps (DDPM), or
# ``edm_log_normal``: the noise level σ_t = sqrt((1 - ᾱ_t) / ᾱ_t) log-normal with EDM_P_MEAN
# and EDM_P_STD (Karras et al. 2022, used by DPDM and DP-FETA for Fashion-MNIST), mapped to
# the nearest timestep of the scheduler.
EDM_P_MEAN = -1.2
EDM_P_STD = 1.2


def draw_timesteps(scheduler: DDPMScheduler, batch: int, generator: torch.Generator,
                   distribution: TimestepDistribution = "uniform") -> torch.Tensor:
    """``batch`` training timesteps (int64, on the CPU) drawn from ``distribution``.

    Each example's timestep is drawn independently of every other example's (so a
    per-example gradient still depends on its own example only).
    """
    num_t = int(scheduler.config["num_train_timesteps"])
    if distribution == "uniform":
        return torch.randint(0, num_t, (batch,), generator=generator)
    if distribution != "edm_log_normal":
        raise ValueError(f"unknown timestep distribution {distribution!r}")
    alphas = scheduler.alphas_cumprod.to(torch.float64)
    log_sigmas = 0.5 * torch.log((1.0 - alphas) / alphas)  # increasing in t
    z = torch.randn(batch, generator=generator, dtype=torch.float64)
    wanted = EDM_P_MEAN + EDM_P_STD * z
    idx = torch.searchsorted(log_sigmas, wanted).clamp(0, num_t - 1)
    below = (idx - 1).clamp(min=0)  # the nearer of the two neighbouring levels
    nearer = (wanted - log_sigmas[below]).abs() < (log_sigmas[idx] - wanted).abs()
    return torch.where(nearer, below, idx).to(torch.int64)


def edm_timestep_mass(scheduler: DDPMScheduler) -> torch.Tensor:
    """Probability of each timestep under ``edm_log_normal`` (for tests and docs): the
    normal mass of the log-σ interval that maps to it."""
    alphas = scheduler.alphas_cumprod.to(torch.float64)
    log_sigmas = 0.5 * torch.log((1.0 - alphas) / alphas)
    mids = (log_sigmas[1:] + log_sigmas[:-1]) / 2
    cdf = 0.5 * (1 + torch.erf((mids - EDM_P_MEAN) / (EDM_P_STD * math.sqrt(2.0))))
    edges = torch.cat([torch.zeros(1, dtype=torch.float64), cdf,
                       torch.ones(1, dtype=torch.float64)])
    return edges[1:] - edges[:-1]


def standard_normal_like(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """float32 N(0, 1) draws of ``like``'s shape on ``like``'s device.

    On the generator's own device (the CPU: every CPU run, bit for bit as before) they come
    from ``generator``. On another device (a GPU training with the CPU job generator) one
    64-bit seed is drawn from ``generator`` and a generator of that device, seeded with it,
    draws the noise there: no [B, C, h, w] tensor is drawn on the host and copied (issue 18:
    the diffusion noise on the device), and the draws remain a function of the job
    generator's state (a resumed run draws the same). Diffusion noise is not privacy noise:
    it only has to be independent of the data (the DP noise is the ChaCha20 source's,
    :mod:`dpsynth_ml.dp.noise`)."""
    if like.device == generator.device or like.device.type == generator.device.type == "cpu":
        return torch.randn(like.shape, generator=generator, device=like.device)
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
    local = torch.Generator(device=like.device).manual_seed(seed)
    return torch.randn(like.shape, generator=local, device=like.device)


def per_sample_diffusion_loss(denoiser: ConditionalDenoiser, scheduler: DDPMScheduler,
                              latents: torch.Tensor, labels: torch.Tensor,
                              generator: torch.Generator,
                              layout: torch.Tensor | None = None,
                              timesteps: TimestepDistribution = "uniform") -> torch.Tensor:
    """Per-example MSE between true and predicted noise at a random timestep.

    Args:
        denoiser: UNet + class embedder (possibly wrapped by opacus).
        scheduler: defines the forward noising q(x_t | x_0).
        latents: clean (scaled) latents [B, C, h, w].
        labels: class indices [B] (after label dropout).
        generator: source of timesteps and noise.
        layout: encoded layout masks [B, C, h, w] of the same examples, for a
            layout-conditioned denoiser (DP-DocLDM, Eq. 8: eps_theta(z_t, t, c, E(m))); the
            layout is never noised, only concatenated to the noisy latent.

    Returns:
        Loss per example, shape [B] (mean over that example's latent elements).
    """
    batch = latents.shape[0]
    # the B timesteps from the (CPU) job generator, then moved (B integers); the noise drawn
    # where the latents are (standard_normal_like)
    steps = draw_timesteps(scheduler, batch, generator, timesteps).to(latents.device)
    noise = standard_normal_like(latents, generator)
    # diffusers annotates the timesteps as IntTensor; any integer tensor is indexed the same
    noisy: torch.Tensor = scheduler.add_noise(latents, noise, cast("torch.IntTensor", steps))
    pred = denoiser(noisy, steps, labels, layout=layout)
    losses: torch.Tensor = (pred - noise).pow(2).flatten(1).mean(dim=1)
    return losses
