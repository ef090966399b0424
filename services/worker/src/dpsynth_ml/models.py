"""Model architecture presets and the class-conditional denoiser.

The latent diffusion model follows DP-LDMs (Liu et al., TMLR 2024): a VAE maps images to a
small latent, a UNet denoises latents, and the class label enters through cross-attention as
a single learned token (``encoder_hidden_states`` of length 1). Classifier-free guidance
(Ho & Salimans 2022) needs an extra "null" class row, which is the last embedding row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from torch import nn

from dpsynth_ml.spec import Preset


@dataclass(frozen=True)
class PresetConfig:
    """Sizes of one architecture preset (chosen by measurement on a 2-core CPU)."""

    vae_channels: tuple[int, ...]
    vae_groups: int
    vae_mid_attention: bool
    latent_channels: int
    unet_channels: tuple[int, ...]
    unet_groups: int
    cross_attention_dim: int
    attention_head_dim: int
    layers_per_block: int
    vae_epochs: int
    vae_learning_rate: float


PRESETS: dict[str, PresetConfig] = {
    # Unit tests: a 20-step DP finetune at 16x16 must take seconds on CPU.
    "tiny": PresetConfig(vae_channels=(16, 32), vae_groups=8, vae_mid_attention=False,
                         latent_channels=4, unet_channels=(32, 64), unet_groups=8,
                         cross_attention_dim=32, attention_head_dim=8, layers_per_block=1,
                         vae_epochs=1, vae_learning_rate=1e-3),
    # CPU demo: pretrain VAE + UNet on ~1,000 digit images in a few minutes on 2 cores.
    # Measured (2 cores, batch 64): VAE step 0.25 s at 32x32, UNet step 0.44 s on 8x8 latents.
    # A 4x VAE downsampling keeps the UNet's attention cheap (T = 64 tokens at 32x32).
    "small": PresetConfig(vae_channels=(16, 32, 32), vae_groups=8, vae_mid_attention=False,
                          latent_channels=4, unet_channels=(64, 128), unet_groups=16,
                          cross_attention_dim=64, attention_head_dim=16, layers_per_block=1,
                          vae_epochs=8, vae_learning_rate=1e-3),
}


def preset_config(preset: Preset) -> PresetConfig:
    """Return the sizes of ``preset``."""
    return PRESETS[preset]


def build_vae(cfg: PresetConfig, *, channels: int, image_size: int) -> AutoencoderKL:
    """A small KL autoencoder that downsamples by 2 ** (len(vae_channels) - 1)."""
    n = len(cfg.vae_channels)
    return AutoencoderKL(
        in_channels=channels, out_channels=channels,
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=cfg.vae_channels, layers_per_block=1,
        latent_channels=cfg.latent_channels, norm_num_groups=cfg.vae_groups,
        sample_size=image_size, mid_block_add_attention=cfg.vae_mid_attention,
    )


def vae_downsample_factor(cfg: PresetConfig) -> int:
    """Spatial reduction of the VAE encoder."""
    return int(2 ** (len(cfg.vae_channels) - 1))


def build_unet(cfg: PresetConfig, *, latent_size: int) -> UNet2DConditionModel:
    """A class-conditional UNet; the class token enters every transformer block via attn2."""
    return UNet2DConditionModel(
        sample_size=latent_size, in_channels=cfg.latent_channels,
        out_channels=cfg.latent_channels, layers_per_block=cfg.layers_per_block,
        block_out_channels=cfg.unet_channels,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        mid_block_type="UNetMidBlock2DCrossAttn",
        cross_attention_dim=cfg.cross_attention_dim,
        attention_head_dim=cfg.attention_head_dim, norm_num_groups=cfg.unet_groups,
    )


def build_scheduler() -> DDPMScheduler:
    """Linear-beta DDPM schedule (Ho et al. 2020), epsilon prediction."""
    return DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear",
                         beta_start=1e-4, beta_end=0.02, prediction_type="epsilon",
                         clip_sample=False)


def build_class_embedder(num_classes: int, dim: int) -> nn.Embedding:
    """Learned class tokens; row ``num_classes`` is the null class for guidance."""
    embedder = nn.Embedding(num_classes + 1, dim)
    nn.init.normal_(embedder.weight, std=0.02)
    return embedder


class ConditionalDenoiser(nn.Module):
    """UNet + class embedder as one module, so opacus can hook both in one forward.

    The label embedding is the cross-attention context of length 1 (DP-LDMs conditioning).
    """

    def __init__(self, unet: UNet2DConditionModel, class_embedder: nn.Embedding) -> None:
        super().__init__()
        self.unet = unet
        self.class_embedder = class_embedder

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        """Predict the noise in ``latents`` at ``timesteps`` for class ``labels``."""
        context = self.class_embedder(labels).unsqueeze(1)
        out: Any = self.unet(latents, timesteps, encoder_hidden_states=context, return_dict=False)
        return out[0]  # type: ignore[no-any-return]


@dataclass
class ModelBundle:
    """All parts of a dpsynth model held in memory."""

    vae: AutoencoderKL
    unet: UNet2DConditionModel
    class_embedder: nn.Embedding
    scheduler: DDPMScheduler

    def parameter_count(self) -> int:
        """Scalars in VAE + UNet + class embedder."""
        modules: list[nn.Module] = [self.vae, self.unet, self.class_embedder]
        return sum(p.numel() for m in modules for p in m.parameters())


def is_attention_parameter(name: str) -> bool:
    """True for parameters of the UNet's transformer attention (``attn1``/``attn2``).

    These are what DP-LDMs fine-tunes ("attention modules"): to_q, to_k, to_v, to_out and
    any norms inside the Attention module.
    """
    parts = name.split(".")
    return "attn1" in parts or "attn2" in parts
