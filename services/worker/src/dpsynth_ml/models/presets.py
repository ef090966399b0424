"""Architecture presets: the fixed sizes of ``tiny``, ``small`` and ``base`` and the diffusers
configs they give.

A preset names a KL autoencoder (LDM-style, downsampling by ``2 ** (len(vae_channels) - 1)``)
and a cross-attention ``UNet2DConditionModel`` denoiser (the DP-LDMs conditioning path, see
:mod:`dpsynth_ml.models.architectures`); :func:`dpsynth_ml.models.architectures.plan_model`
turns one into a :class:`~dpsynth_ml.models.architectures.ModelPlan`, and
:mod:`dpsynth_ml.models.pixel_plan` reuses its UNet sizes in pixel space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel

from dpsynth_ml.spec import InvalidSpecError, Preset


@dataclass(frozen=True)
class PresetConfig:
    """Sizes of one architecture preset (tiny/small chosen by measurement on a 2-core CPU)."""

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
    down_block_types: tuple[str, ...] = ("CrossAttnDownBlock2D", "DownBlock2D")
    up_block_types: tuple[str, ...] = ("UpBlock2D", "CrossAttnUpBlock2D")


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
    # GPUs: a ~31M-parameter denoiser (LDM-style: attention at latent downsampling 2 and 4
    # and in the middle, 8 heads) on 32x32 latents (128x128 images) or 64x64 (256x256);
    # the VAE downsamples by 4 (LDM KL-F4, the DP-DocLDM autoencoder's best variant).
    "base": PresetConfig(vae_channels=(64, 128, 256), vae_groups=32, vae_mid_attention=True,
                         latent_channels=4, unet_channels=(96, 192, 256), unet_groups=32,
                         cross_attention_dim=256, attention_head_dim=8, layers_per_block=2,
                         vae_epochs=20, vae_learning_rate=4.5e-4,
                         down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                           "CrossAttnDownBlock2D"),
                         up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                         "UpBlock2D")),
}


def preset_config(preset: Preset) -> PresetConfig:
    """Return the sizes of ``preset`` (not ``custom``)."""
    if preset not in PRESETS:
        raise InvalidSpecError(f"{preset!r} is not a preset with fixed sizes")
    return PRESETS[preset]


def build_vae(cfg: PresetConfig, *, channels: int, image_size: int) -> AutoencoderKL:
    """A small KL autoencoder that downsamples by 2 ** (len(vae_channels) - 1)."""
    vae: AutoencoderKL = AutoencoderKL(**_preset_vae_config(cfg, channels=channels,
                                                             image_size=image_size))
    return vae


def vae_downsample_factor(cfg: PresetConfig) -> int:
    """Spatial reduction of the VAE encoder."""
    return int(2 ** (len(cfg.vae_channels) - 1))


def build_unet(cfg: PresetConfig, *, latent_size: int,
               layout_channels: int = 0) -> UNet2DConditionModel:
    """A class-conditional UNet; the class token enters every transformer block via attn2."""
    unet: UNet2DConditionModel = UNet2DConditionModel(**_preset_unet_config(
        cfg, latent_size=latent_size, layout_channels=layout_channels))
    return unet


def _preset_vae_config(cfg: PresetConfig, *, channels: int, image_size: int) -> dict[str, Any]:
    n = len(cfg.vae_channels)
    return dict(in_channels=channels, out_channels=channels,
                down_block_types=("DownEncoderBlock2D",) * n,
                up_block_types=("UpDecoderBlock2D",) * n,
                block_out_channels=cfg.vae_channels, layers_per_block=1,
                latent_channels=cfg.latent_channels, norm_num_groups=cfg.vae_groups,
                sample_size=image_size, mid_block_add_attention=cfg.vae_mid_attention)


def _preset_unet_config(cfg: PresetConfig, *, latent_size: int,
                        layout_channels: int) -> dict[str, Any]:
    return dict(sample_size=latent_size, in_channels=cfg.latent_channels + layout_channels,
                out_channels=cfg.latent_channels, layers_per_block=cfg.layers_per_block,
                block_out_channels=cfg.unet_channels, down_block_types=cfg.down_block_types,
                up_block_types=cfg.up_block_types, mid_block_type="UNetMidBlock2DCrossAttn",
                cross_attention_dim=cfg.cross_attention_dim,
                attention_head_dim=cfg.attention_head_dim, norm_num_groups=cfg.unet_groups)
