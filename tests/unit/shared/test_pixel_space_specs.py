"""The pretrain spec's ``space`` (issue 18, item 2): latent by default, pixel for images up
to 64x64 (a denoiser on the pixels, no autoencoder), documented in the OpenAPI schema."""

from __future__ import annotations

import pytest
from dpsynth_shared.job_specs import MAX_PIXEL_IMAGE_SIZE, JobSpec, PretrainSpec
from pydantic import TypeAdapter, ValidationError

SPECS = TypeAdapter(JobSpec)
PRETRAIN = {"type": "pretrain", "dataset_id": "ds_public", "preset": "small"}


def test_space_defaults_to_latent() -> None:
    spec = SPECS.validate_python(PRETRAIN)
    assert isinstance(spec, PretrainSpec) and spec.space == "latent"
    # a latent model takes every image size the spec allows
    assert PretrainSpec(dataset_id="ds_x", image_size=256).space == "latent"


@pytest.mark.parametrize("size", [8, 28, 32, MAX_PIXEL_IMAGE_SIZE])
def test_a_pixel_space_pretrain_is_accepted_up_to_64(size: int) -> None:
    spec = SPECS.validate_python({**PRETRAIN, "space": "pixel", "image_size": size})
    assert isinstance(spec, PretrainSpec)
    assert (spec.space, spec.image_size) == ("pixel", size)
    assert MAX_PIXEL_IMAGE_SIZE == 64


@pytest.mark.parametrize("size", [68, 128, 256])
def test_a_pixel_space_pretrain_above_64_is_refused(size: int) -> None:
    with pytest.raises(ValidationError, match="space 'pixel' takes image_size at most 64"):
        SPECS.validate_python({**PRETRAIN, "space": "pixel", "image_size": size})
    # the same size in latent space is fine
    assert SPECS.validate_python({**PRETRAIN, "space": "latent", "image_size": size})


def test_only_the_two_spaces_exist() -> None:
    for bad in ("pixels", "Pixel", "", None, 1):
        with pytest.raises(ValidationError, match="space"):
            SPECS.validate_python({**PRETRAIN, "space": bad})


def test_a_custom_pixel_architecture_has_no_autoencoder() -> None:
    custom = {**PRETRAIN, "preset": "custom", "space": "pixel", "image_size": 32}
    spec = SPECS.validate_python({**custom, "architecture": {"unet_class": "UNet2DModel"}})
    assert isinstance(spec, PretrainSpec) and spec.architecture is not None
    with pytest.raises(ValidationError, match=r"architecture\.vae must be empty"):
        SPECS.validate_python({**custom, "architecture": {"vae": {"latent_channels": 4}}})


def test_space_works_with_the_other_pretrain_options() -> None:
    layout = PretrainSpec(dataset_id="ds_x", space="pixel", layout_conditioning=True)
    masks = PretrainSpec(dataset_id="ds_x", space="pixel", target="masks", image_size=64)
    assert layout.space == masks.space == "pixel"


def test_the_schema_documents_space() -> None:
    schema = PretrainSpec.model_json_schema()
    space = schema["properties"]["space"]
    assert space["enum"] == ["latent", "pixel"] and space["default"] == "latent"
    assert "no autoencoder" in space["description"] and "64" in space["description"]
    assert "space" not in schema.get("required", [])
    assert "64" in schema["properties"]["image_size"]["description"]
