"""Planning a pixel-space model: the UNet denoises the images themselves, no autoencoder.

For small images (at most :data:`dpsynth_ml.spec.MAX_PIXEL_IMAGE_SIZE` a side) a VAE costs
more than it saves: its reconstruction error alone bounds the quality of every sample, and
its training is a phase of its own. A pixel-space model keeps everything else of the latent
recipe: the same preset UNets (or a checked custom config), the same conditioning paths,
the same scheduler; only the sizes change. The UNet's ``sample_size`` is the image size,
its ``out_channels`` the image channels and its ``in_channels`` those plus the layout
mask's channels under layout conditioning (the mask, in [-1, 1], is concatenated as is).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dpsynth_ml.models.architectures import (
    PLATFORM_UNET_KEYS,
    UNET_CLASSES,
    ModelPlan,
    check_custom_unet,
)
from dpsynth_ml.models.presets import _preset_unet_config, preset_config
from dpsynth_ml.spec import Architecture, InvalidSpecError

if TYPE_CHECKING:
    from dpsynth_ml.spec import PretrainTraining


def plan_pixel_model(spec: PretrainTraining) -> ModelPlan:
    """The pixel-space architecture of a pretrain (``spec.space == "pixel"``).

    Raises:
        InvalidSpecError: a custom architecture with a VAE config, platform-owned or
            unknown UNet keys, values outside the allow-list, or an image size the UNet
            cannot downsample evenly (a pixel UNet's skips must match its upsampled maps).
    """
    layout = spec.channels if spec.layout_conditioning else 0
    if spec.preset != "custom":
        cfg = preset_config(spec.preset)
        unet_config = {**_preset_unet_config(cfg, latent_size=spec.image_size,
                                             layout_channels=0),
                       "in_channels": spec.channels + layout, "out_channels": spec.channels}
        _check_divisible(spec.image_size, unet_config)
        return ModelPlan(unet_class="UNet2DConditionModel", vae_config=None,
                         unet_config=unet_config, latent_channels=spec.channels,
                         layout_channels=layout, vae_epochs=0, vae_learning_rate=0.0,
                         space="pixel")
    if spec.architecture is None:
        raise InvalidSpecError("preset 'custom' needs an architecture")
    return _plan_custom_pixel(spec, spec.architecture, layout)


def _plan_custom_pixel(spec: PretrainTraining, arch: Architecture, layout: int) -> ModelPlan:
    if arch.vae:
        raise InvalidSpecError("a pixel-space model has no autoencoder: the custom "
                               "architecture must not give a vae config")
    if arch.unet_class not in UNET_CLASSES:
        raise InvalidSpecError(f"unet_class {arch.unet_class!r} is not allowed (allowed: "
                               f"{', '.join(UNET_CLASSES)})")
    taken = sorted(k for k in arch.unet if k in PLATFORM_UNET_KEYS)
    if taken:
        raise InvalidSpecError(f"the custom unet config sets {taken}: these are set by the "
                               "platform (sizes from the data, conditioning)")
    unet_config: dict[str, Any] = {**arch.unet, "sample_size": spec.image_size,
                                   "in_channels": spec.channels + layout,
                                   "out_channels": spec.channels}
    check_custom_unet(arch, unet_config, num_classes=spec.num_classes)
    _check_divisible(spec.image_size, unet_config, arch.unet_class)
    return ModelPlan(unet_class=arch.unet_class, vae_config=None, unet_config=unet_config,
                     latent_channels=spec.channels, layout_channels=layout, vae_epochs=0,
                     vae_learning_rate=0.0, space="pixel")


def unet_downsample_factor(unet_config: Mapping[str, Any],
                           unet_class: str = "UNet2DConditionModel") -> int:
    """Spatial reduction of a UNet config: every block but the last halves the map (the
    class's default block widths when the config gives none)."""
    widths = unet_config.get("block_out_channels")
    if widths is None:
        init = inspect.signature(UNET_CLASSES[unet_class].__init__)
        widths = init.parameters["block_out_channels"].default
    return int(2 ** (len(widths) - 1))


def _check_divisible(image_size: int, unet_config: Mapping[str, Any],
                     unet_class: str = "UNet2DConditionModel") -> None:
    factor = unet_downsample_factor(unet_config, unet_class)
    if image_size % factor:
        raise InvalidSpecError(f"image_size {image_size} is not a multiple of the UNet's "
                               f"downsampling factor {factor} (pixel space)")
