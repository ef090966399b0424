"""Pure helpers of the epsilon-prediction diffusion objective (Ho et al. 2020)."""

from __future__ import annotations

from typing import cast

import torch
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler

from dpsynth_ml.models.architectures import ConditionalDenoiser


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


def per_sample_diffusion_loss(denoiser: ConditionalDenoiser, scheduler: DDPMScheduler,
                              latents: torch.Tensor, labels: torch.Tensor,
                              generator: torch.Generator,
                              layout: torch.Tensor | None = None) -> torch.Tensor:
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
    num_t = int(scheduler.config["num_train_timesteps"])
    # drawn with the (CPU) job generator, then moved: the same draws on any device
    timesteps = torch.randint(0, num_t, (batch,), generator=generator).to(latents.device)
    noise = torch.randn(latents.shape, generator=generator).to(latents.device)
    # diffusers annotates the timesteps as IntTensor; any integer tensor is indexed the same
    noisy: torch.Tensor = scheduler.add_noise(latents, noise, cast("torch.IntTensor", timesteps))
    pred = denoiser(noisy, timesteps, labels, layout=layout)
    losses: torch.Tensor = (pred - noise).pow(2).flatten(1).mean(dim=1)
    return losses
