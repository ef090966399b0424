"""The parts of an uploaded model against each other, once every member was checked on its
own (:mod:`dpsynth_api.models.validation`): the layout of the model's space, channels,
sizes, classes and class tokens.

The two layouts (``space`` in ``dpsynth_model.json``, :mod:`dpsynth_api.models.info_file`):

- ``latent``: ``vae/`` is required; the denoiser predicts the autoencoder's latent channels
  and takes at least them (more with layout conditioning);
- ``pixel``: no ``vae/``; the denoiser works on the images themselves: it predicts the
  image's channels, takes them (plus the layout channels of a layout-conditioned model) and
  its ``sample_size`` is the image size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dpsynth_shared.model_configs import config_class, estimate_parameters

from dpsynth_api.models.conditioning import layout_channels
from dpsynth_api.models.info_file import INFO_FILE, model_space
from dpsynth_api.models.info_file import invalid_model as _invalid

if TYPE_CHECKING:
    from dpsynth_api.models.validation import CheckedModel

#: diffusers' in/out channels of a UNet class whose config leaves them out.
_UNET_DEFAULT_CHANNELS = {"UNet2DConditionModel": 4, "UNet2DModel": 3}


def check_consistency(checked: CheckedModel, *, layout_hint: str) -> None:
    """The parts must fit together.

    Args:
        checked: the checked info and configs of the whole model.
        layout_hint: the sentence describing both layouts, appended to layout refusals.

    Raises:
        DpsynthError: 422 ``invalid_model`` naming the two sides that disagree.
    """
    info = checked.info
    for entry, config in checked.configs.values():
        values = checked.values.get((entry.prefix, entry.component or ""))
        if values is None:
            continue
        described = estimate_parameters(config_class(entry.component or "", config), config)
        if values > described:
            raise _invalid(f"{entry.prefix}{entry.component}/ weights hold {values:,} values, "
                           f"more than the {described:,} parameters its config describes")
    pixel = model_space(info) == "pixel"
    vae = checked.config("vae")
    if pixel and vae is not None:
        raise _invalid(f"{INFO_FILE} says space 'pixel' (a denoiser on the images, no "
                       f"autoencoder), but the model has a vae/ folder; {layout_hint}",
                       file="vae/config.json", space="pixel")
    if not pixel and vae is None:
        raise _invalid(f"the model has no vae/ folder, which a latent model ({INFO_FILE} space "
                       f"'latent', the default) needs; {layout_hint}", space="latent")
    latent = info["channels"] if vae is None else _check_vae(info, vae)
    unet_class = info.get("extra", {}).get("unet_class")
    prefixes = sorted({e.prefix for e, _ in checked.configs.values() if e.component == "unet"})
    for prefix in prefixes:
        unet = checked.config("unet", prefix) or {}
        where = f"{prefix}unet/config.json"
        if unet_class is not None and unet.get("_class_name") != unet_class:
            raise _invalid(f"{where} holds {unet.get('_class_name')}, {INFO_FILE} says "
                           f"{unet_class}")
        if pixel:
            _check_pixel_unet(where, unet, info)
        else:
            _check_latent_unet(where, unet, latent)
        embedder = checked.config("class_embedder", prefix) or checked.config("class_embedder")
        if embedder is None and unet.get("_class_name") == "UNet2DConditionModel":
            raise _invalid(f"{prefix}class_embedder/ is missing: a UNet2DConditionModel takes "
                           "its class token from it")
        if embedder is not None:
            _check_embedder(prefix, where, embedder, unet, info)


def _check_vae(info: Mapping[str, Any], vae: Mapping[str, Any]) -> int:
    """A latent model's autoencoder against the info; returns its latent channels."""
    if vae.get("in_channels", 3) != info["channels"]:
        raise _invalid(f"vae/config.json has in_channels {vae.get('in_channels', 3)}, "
                       f"{INFO_FILE} says channels {info['channels']}")
    latent = vae.get("latent_channels", 4)
    if latent != info["latent_channels"]:
        raise _invalid(f"vae/config.json has latent_channels {latent}, {INFO_FILE} says "
                       f"{info['latent_channels']}")
    return int(latent)


def _check_latent_unet(where: str, unet: Mapping[str, Any], latent: int) -> None:
    if unet.get("out_channels", latent) != latent:
        raise _invalid(f"{where} has out_channels {unet.get('out_channels')}, the vae "
                       f"has {latent} latent channels")
    if unet.get("in_channels", latent) < latent:
        raise _invalid(f"{where} has in_channels {unet.get('in_channels')}, fewer than "
                       f"the vae's {latent} latent channels")


def _check_pixel_unet(where: str, unet: Mapping[str, Any], info: Mapping[str, Any]) -> None:
    """A pixel model's denoiser predicts the image's channels, takes them (and the layout
    channels of a layout-conditioned model), at the image's size."""
    channels, size, layout = info["channels"], info["image_size"], layout_channels(info)
    default = _UNET_DEFAULT_CHANNELS.get(str(unet.get("_class_name")), 4)
    out_channels = unet.get("out_channels", default)
    if out_channels != channels:
        raise _invalid(f"{where} has out_channels {out_channels}; a pixel model's denoiser "
                       f"predicts the image's {channels} channel(s) ({INFO_FILE} channels)",
                       file=where, key="out_channels")
    in_channels = unet.get("in_channels", default)
    if in_channels != channels + layout:
        takes = f"the image's {channels} channel(s)" + (
            f" and {layout} layout channel(s) ({INFO_FILE} extra.layout_channels)"
            if layout else "")
        raise _invalid(f"{where} has in_channels {in_channels}; a pixel model's denoiser "
                       f"takes {takes}", file=where, key="in_channels")
    sample = unet.get("sample_size")
    sides = list(sample) if isinstance(sample, list | tuple) else [sample]
    if not sides or any(s != size for s in sides):
        raise _invalid(f"{where} has sample_size {sample!r}; a pixel model's denoiser works "
                       f"on the {size}x{size} images ({INFO_FILE} image_size)",
                       file=where, key="sample_size")


def _check_embedder(prefix: str, where: str, embedder: Mapping[str, Any],
                    unet: Mapping[str, Any], info: Mapping[str, Any]) -> None:
    if embedder["num_embeddings"] != info["num_classes"] + 1:
        raise _invalid(f"{prefix}class_embedder/config.json has "
                       f"{embedder['num_embeddings']} rows, {INFO_FILE} needs "
                       f"num_classes + 1 = {info['num_classes'] + 1}")
    cross = unet.get("cross_attention_dim")
    if isinstance(cross, int) and embedder["embedding_dim"] != cross:
        raise _invalid(f"{prefix}class_embedder/config.json has embedding_dim "
                       f"{embedder['embedding_dim']}, {where} has cross_attention_dim "
                       f"{cross}")
