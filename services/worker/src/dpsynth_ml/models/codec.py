"""Records to and from the space a model's denoiser works in, for either kind of model.

A latent model (``ModelInfo.space == "latent"``) works on scaled VAE latents; a pixel model
(``"pixel"``, no VAE) on the images themselves mapped from [0, 1] to [-1, 1]. Every caller
(pretraining, finetune setup, the padded encoding, layouts, the sampler) goes through
:func:`encode_records` and :func:`decode_samples`, so none of them branches on the space and
the two stay the same code path apart from this module.

The VAE encoders (:func:`encode_images`, :func:`encode_layouts`) live here too and are
re-exported by :mod:`dpsynth_ml.models.architectures`, which imports this module (so this
one needs the model bundle's type only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from torch import nn

from dpsynth_ml.data import images_to_tensor
from dpsynth_ml.spec import InvalidSpecError, ModelInfo

if TYPE_CHECKING:
    from dpsynth_ml.models.architectures import ModelBundle

_ENCODE_CHUNK = 256


def pixels_to_model(images: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] [N, C, H, W] as a pixel-space denoiser sees them: ``x * 2 - 1``."""
    return images.float() * 2.0 - 1.0


def model_to_pixels(x: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pixels_to_model`, clamped to [0, 1] (samples overshoot)."""
    return ((x + 1.0) / 2.0).clamp(0.0, 1.0)


@torch.no_grad()
def encode_images(vae: AutoencoderKL, images: np.ndarray, *, image_size: int, channels: int,
                  scaling_factor: float) -> torch.Tensor:
    """Scaled VAE latents (posterior means x scaling factor) of uint8 [N, H, W, C] images.

    The VAE is put in eval mode and frozen; encoding runs in chunks of 256.

    Raises:
        InvalidSpecError: if there is nothing to encode.
    """
    vae.requires_grad_(False).eval()
    device = next(vae.parameters()).device
    chunks = []
    for start in range(0, len(images), _ENCODE_CHUNK):
        x = images_to_tensor(images[start:start + _ENCODE_CHUNK], image_size=image_size,
                             channels=channels).to(device)
        chunks.append(vae.encode(x).latent_dist.mean * scaling_factor)
    if not chunks:
        raise InvalidSpecError("nothing to encode (no images)")
    return torch.cat(chunks)


def encode_layouts(bundle: ModelBundle, info: ModelInfo, masks: np.ndarray) -> torch.Tensor:
    """Layout masks encoded as the denoiser expects them (DP-DocLDM's E(m)).

    Masks (uint8 [N, H, W, 1], 255 = text line) are preprocessed like images (resized to the
    model's image size, repeated to its channels, mapped to [-1, 1]) and encoded by the
    model's own frozen VAE: posterior mean x the model's latent scaling factor. A
    pixel-space model takes the preprocessed mask itself (:func:`encode_records`).

    Args:
        bundle: the model (its VAE, if any, encodes).
        info: the model's info (image size, channels, scaling factor).
        masks: uint8 [N, H, W, 1].

    Returns:
        float [N, latent_channels, h, w], to pass as ``layout=`` to the denoiser.

    Raises:
        InvalidSpecError: on a wrong mask array or a model without layout conditioning.
    """
    if masks.dtype != np.uint8 or masks.ndim != 4 or masks.shape[-1] != 1:
        raise InvalidSpecError("layout masks must be uint8 [N, H, W, 1]")
    if bundle.layout_channels <= 0:
        raise InvalidSpecError("this model has no layout conditioning")
    latents = encode_records(bundle, info, masks)
    if latents.shape[1] != bundle.layout_channels:
        raise InvalidSpecError("the VAE's latent channels do not match the UNet's layout input")
    return latents


def check_space(bundle: ModelBundle, info: ModelInfo) -> None:
    """The model's parts agree with its info: a VAE exactly when the space is latent.

    Raises:
        InvalidSpecError: a pixel model with a VAE or a latent model without one.
    """
    if bundle.space != info.space:
        raise InvalidSpecError(f"the model info says space {info.space!r}, its parts are a "
                               f"{bundle.space} model" + (" (no vae/)" if bundle.vae is None
                                                          else " (with a vae/)"))


@torch.no_grad()
def encode_with(vae: AutoencoderKL | None, images: np.ndarray, *, image_size: int,
                channels: int, scaling_factor: float) -> torch.Tensor:
    """uint8 [N, H, W, C] images in the space of a model with this ``vae`` (None: pixels).

    Pixel space: the preprocessed images (resized, channel-matched; uint8 / 255 * 2 - 1,
    :func:`dpsynth_ml.data.images_to_tensor`), in chunks of the VAE's chunk size so that
    the padded encoding's per-chunk cost pattern is the same in both spaces.

    Raises:
        InvalidSpecError: if there is nothing to encode.
    """
    if vae is not None:
        return encode_images(vae, images, image_size=image_size, channels=channels,
                             scaling_factor=scaling_factor)
    chunks = [images_to_tensor(images[start:start + _ENCODE_CHUNK], image_size=image_size,
                               channels=channels)
              for start in range(0, len(images), _ENCODE_CHUNK)]
    if not chunks:
        raise InvalidSpecError("nothing to encode (no images)")
    return torch.cat(chunks)


def encode_records(bundle: ModelBundle, info: ModelInfo, images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W, C] images (or masks) as the model's denoiser works on them.

    Latent space: VAE posterior means x ``info.vae_scaling_factor``; pixel space: the images
    in [-1, 1]. Returns float [N, info.latent_channels, h, w] on the VAE's device (CPU for
    a pixel model).

    Raises:
        InvalidSpecError: no images, or parts that disagree with the info's space.
    """
    check_space(bundle, info)
    return encode_with(bundle.vae, images, image_size=info.image_size,
                       channels=info.channels, scaling_factor=info.vae_scaling_factor)


@torch.no_grad()
def decode_samples(bundle: ModelBundle, info: ModelInfo, latents: torch.Tensor) -> torch.Tensor:
    """Denoised samples of the model's space as images in [0, 1] [N, C, H, W].

    Latent space: decoded by the VAE (latents / scaling factor); pixel space: the samples
    themselves. Either way clamped to [-1, 1] and mapped by :func:`model_to_pixels`.
    """
    check_space(bundle, info)
    if bundle.vae is None:
        return model_to_pixels(latents)
    images = bundle.vae.decode(latents / info.vae_scaling_factor).sample
    return model_to_pixels(images.clamp(-1.0, 1.0))


__all__ = ["check_space", "decode_samples", "encode_images", "encode_layouts",
           "encode_records", "encode_with", "model_to_pixels", "pixels_to_model"]


@contextlib.contextmanager
def vae_on(bundle: ModelBundle, device: torch.device) -> Iterator[None]:
    """The bundle's VAE (if any) on ``device`` inside the block, back on the CPU after it
    (a finetune encodes its private records on the job's device; the DP steps do not need
    the VAE again, and the model is written from the host)."""
    if bundle.vae is None or device.type == "cpu":
        yield
        return
    vae = cast("nn.Module", bundle.vae)
    vae.to(device)
    try:
        yield
    finally:
        vae.to(torch.device("cpu"))
