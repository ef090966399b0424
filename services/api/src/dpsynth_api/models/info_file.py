"""``dpsynth_model.json``: the schema of a model's info file (the ML core's ``ModelInfo``,
which the api cannot import) and the checks of the file on its own.

A model works in one of two spaces (``space``; absent means ``latent``, the only space of
models written before it existed):

- ``latent``: an autoencoder (``vae/``) and a denoiser on its latents;
- ``pixel``: no autoencoder, the denoiser works on the images themselves, which are at most
  ``MAX_PIXEL_IMAGE_SIZE`` pixels a side; its "latents" are the pixels, so
  ``latent_channels == channels`` and ``vae_scaling_factor == 1.0``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import MAX_PIXEL_IMAGE_SIZE, DenoiserSpace
from dpsynth_shared.model_configs import DEFAULT_LIMITS
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

INFO_FILE = "dpsynth_model.json"
MODEL_FORMAT_VERSION = 1
#: What ``space`` means when the file does not say.
DEFAULT_SPACE: DenoiserSpace = "latent"


def invalid_model(detail: str, **extensions: Any) -> DpsynthError:
    """The 422 ``invalid_model`` problem every refused upload answers."""
    return DpsynthError(ErrorCode.INVALID_MODEL, detail, **extensions)


class ModelInfoFile(BaseModel):
    """The schema of ``dpsynth_model.json`` (the ML core's ``ModelInfo``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format_version: StrictInt
    preset: Literal["tiny", "small", "base", "custom"]
    space: DenoiserSpace = Field(DEFAULT_SPACE, description="latent (vae/ + a latent "
                                 "denoiser) or pixel (no vae/, a denoiser on the pixels)")
    image_size: StrictInt = Field(ge=4, le=1024)
    channels: StrictInt = Field(ge=1, le=4)
    latent_channels: StrictInt = Field(ge=1, le=16)
    vae_scaling_factor: float = Field(gt=0, le=1e3, allow_inf_nan=False)
    num_classes: StrictInt = Field(ge=1, le=DEFAULT_LIMITS.max_classes)
    class_names: list[StrictStr] = Field(min_length=1, max_length=DEFAULT_LIMITS.max_classes)
    null_class: StrictInt
    rng: Literal["os", "test"]
    training_kind: Literal["pretrain", "finetune"]
    steps: StrictInt = Field(ge=0)
    extra: dict[str, Any] = Field(default_factory=dict)


def model_space(info: Mapping[str, Any]) -> DenoiserSpace:
    """A checked info's space (``latent`` when the file does not say)."""
    return "pixel" if info.get("space") == "pixel" else DEFAULT_SPACE


def parse_info(data: bytes) -> dict[str, Any]:
    """Parse and validate ``dpsynth_model.json``.

    Raises:
        DpsynthError: 422 ``invalid_model`` naming the field.
    """
    try:
        info = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise invalid_model(f"{INFO_FILE} is not valid JSON", file=INFO_FILE) from exc
    if not isinstance(info, dict):
        raise invalid_model(f"{INFO_FILE} must be a JSON object", file=INFO_FILE)
    if info.get("format_version") != MODEL_FORMAT_VERSION:
        raise invalid_model(f"{INFO_FILE} has format_version {info.get('format_version')!r}; "
                            f"this platform reads version {MODEL_FORMAT_VERSION}",
                            file=INFO_FILE)
    try:
        checked = ModelInfoFile.model_validate(info)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise invalid_model(f"{INFO_FILE}: {loc}: {first['msg']}", file=INFO_FILE,
                            errors=[{"loc": list(e["loc"]), "msg": e["msg"]}
                                    for e in exc.errors()]) from exc
    names = checked.class_names
    if any(not n or len(n) > 200 for n in names) or len(set(names)) != len(names):
        raise invalid_model(f"{INFO_FILE}: class_names must be distinct non-empty names of at "
                            "most 200 characters", file=INFO_FILE)
    if checked.num_classes != len(names):
        raise invalid_model(f"{INFO_FILE}: num_classes is {checked.num_classes} but "
                            f"class_names has {len(names)} names", file=INFO_FILE)
    if checked.null_class != checked.num_classes:
        raise invalid_model(f"{INFO_FILE}: null_class must be num_classes "
                            f"({checked.num_classes})", file=INFO_FILE)
    if checked.space == "pixel":
        _check_pixel_info(checked)
    return info


def _check_pixel_info(info: ModelInfoFile) -> None:
    """A pixel model's denoiser works on the images: no autoencoder sizes of its own."""
    if info.image_size > MAX_PIXEL_IMAGE_SIZE:
        raise invalid_model(f"{INFO_FILE}: space 'pixel' takes image_size at most "
                            f"{MAX_PIXEL_IMAGE_SIZE}, not {info.image_size} (larger images "
                            "need a latent model)", file=INFO_FILE, key="image_size")
    if info.latent_channels != info.channels:
        raise invalid_model(f"{INFO_FILE}: space 'pixel' has no autoencoder, so "
                            f"latent_channels must be channels ({info.channels}), not "
                            f"{info.latent_channels}", file=INFO_FILE, key="latent_channels")
    if info.vae_scaling_factor != 1.0:
        raise invalid_model(f"{INFO_FILE}: space 'pixel' has no autoencoder, so "
                            f"vae_scaling_factor must be 1.0, not {info.vae_scaling_factor}",
                            file=INFO_FILE, key="vae_scaling_factor")
