"""Pixel-space model uploads (issue 18, item 2): a model whose denoiser works on the images,
with no autoencoder, is accepted in its own layout (no ``vae/``) and refused, with the
module's ``invalid_model`` problem, whenever its layout or its parts do not fit its space;
latent models validate as before (docs/architecture.md, "Model folders").

The checks run on the validation functions the upload route calls (header check, then the
contents check and repack), on zips built here: no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dpsynth_api.archives import ArchiveLimits, SafeArchive
from dpsynth_api.models.service import _public_info
from dpsynth_api.models.validation import (
    CheckedModel,
    check_model_archive,
    parse_info,
    repack,
)
from dpsynth_shared.errors import DpsynthError

from tests.support.pixel_models import folder_files, pixel_model_dir
from tests.unit.api import builders as b

pytest.importorskip("diffusers")

LIMITS = ArchiveLimits(max_uncompressed_bytes=64 * 1024 * 1024, max_members=1000)
VAE_FILES = ("vae/config.json", "vae/diffusion_pytorch_model.safetensors")
UNET = "unet/config.json"


@pytest.fixture(scope="module")
def pixel_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a real tiny pixel model (UNet2DConditionModel on 16x16 grayscale)."""
    return folder_files(pixel_model_dir(tmp_path_factory.mktemp("pixel"),
                                        class_names=["a", "b"], image_size=16))


def validate(members: dict[str, bytes], tmp_path: Path) -> CheckedModel:
    """What ``POST /v1/models`` runs on an upload: the header check, then the contents."""
    raw = tmp_path / "upload.zip"
    raw.write_bytes(b.zip_bytes(members))
    archive = SafeArchive(raw, LIMITS, private=False)
    root = check_model_archive(archive)
    return repack(archive, root, tmp_path / "model.tar")


def refused(members: dict[str, bytes], tmp_path: Path, match: str) -> DpsynthError:
    with pytest.raises(DpsynthError, match=match) as info:
        validate(members, tmp_path)
    assert info.value.code == "invalid_model" and info.value.status == 422
    return info.value


def with_info(members: dict[str, bytes], **changes: Any) -> dict[str, bytes]:
    info = {**json.loads(members["dpsynth_model.json"]), **changes}
    return {**members, "dpsynth_model.json": json.dumps(info).encode()}


def with_unet(members: dict[str, bytes], **changes: Any) -> dict[str, bytes]:
    config = {**json.loads(members[UNET]), **changes}
    return {**members, UNET: json.dumps(config).encode()}


def without_vae(members: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in members.items() if k not in VAE_FILES}


# --- accepted -----------------------------------------------------------------------------

def test_a_pixel_model_without_an_autoencoder_is_accepted(
        pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    assert not any(name.startswith("vae/") for name in pixel_model)
    checked = validate(pixel_model, tmp_path)
    assert checked.info["space"] == "pixel"
    assert checked.config("vae") is None and checked.config("unet") is not None
    assert _public_info(checked.info)["space"] == "pixel"  # the model's api view


def test_a_pixel_unet2dmodel_without_class_embedder_is_accepted(tmp_path: Path) -> None:
    folder = pixel_model_dir(tmp_path / "m", class_names=["a", "b", "c"], image_size=8,
                             channels=3, unet_class="UNet2DModel")
    members = folder_files(folder)
    assert not any(n.startswith(("vae/", "class_embedder/")) for n in members)
    checked = validate(members, tmp_path)
    assert checked.info["channels"] == checked.info["latent_channels"] == 3


def test_a_pixel_model_archived_under_its_folder_name_is_accepted(
        pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    checked = validate({f"mymodel/{k}": v for k, v in pixel_model.items()}, tmp_path)
    assert checked.info["space"] == "pixel"


def test_a_latent_model_still_validates_with_or_without_a_space(tmp_path: Path) -> None:
    for members in (b.model_folder(), b.model_folder(info={"space": "latent"})):
        checked = validate(members, tmp_path)
        assert checked.config("vae") is not None
        assert _public_info(checked.info)["space"] == "latent"


# --- refused: the layout of the space ------------------------------------------------------

def test_a_pixel_model_carrying_a_vae_is_refused(pixel_model: dict[str, bytes],
                                                 tmp_path: Path) -> None:
    vae = {k: v for k, v in b.model_folder().items() if k in VAE_FILES}
    error = refused({**pixel_model, **vae}, tmp_path, "space 'pixel'.*has a vae/ folder")
    assert "a pixel model" in error.detail and "a latent model" in error.detail  # both layouts
    assert error.extensions["space"] == "pixel"


def test_a_latent_model_without_a_vae_is_refused(pixel_model: dict[str, bytes],
                                                 tmp_path: Path) -> None:
    error = refused(without_vae(b.model_folder()), tmp_path, "no vae/ folder.*latent model")
    assert "a pixel model" in error.detail and "a latent model" in error.detail
    assert error.extensions["space"] == "latent"
    # a pixel model's folder that does not say its space is a latent model without a vae
    info = {k: v for k, v in json.loads(pixel_model["dpsynth_model.json"]).items()
            if k != "space"}
    refused({**pixel_model, "dpsynth_model.json": json.dumps(info).encode()}, tmp_path,
            "no vae/ folder")
    refused(with_info(pixel_model, space="latent"), tmp_path, "no vae/ folder")


# --- refused: the parts of a pixel model ---------------------------------------------------

@pytest.mark.parametrize(("changes", "match"), [
    ({"in_channels": 2}, "unet/config.json has in_channels 2; a pixel model's denoiser takes "
                         "the image's 1 channel"),
    ({"out_channels": 4}, "unet/config.json has out_channels 4; a pixel model's denoiser "
                          "predicts the image's 1 channel"),
    ({"sample_size": 8}, "sample_size 8; a pixel model's denoiser works on the 16x16 images"),
    ({"sample_size": None}, "sample_size None"),
])
def test_a_pixel_unet_that_does_not_work_on_the_images_is_refused(
        pixel_model: dict[str, bytes], tmp_path: Path, changes: dict[str, Any],
        match: str) -> None:
    error = refused(with_unet(pixel_model, **changes), tmp_path, match)
    assert error.extensions["file"] == UNET and error.extensions["key"] == next(iter(changes))


def test_a_layout_conditioned_pixel_unet_takes_the_layout_channels(
        pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    info = json.loads(pixel_model["dpsynth_model.json"])
    layout = with_info(with_unet(pixel_model, in_channels=2),
                       extra={**info["extra"], "layout_channels": 1})
    checked = validate(layout, tmp_path)
    assert _public_info(checked.info)["layout_channels"] == 1
    refused(with_info(pixel_model, extra={**info["extra"], "layout_channels": 1}), tmp_path,
            "in_channels 1; a pixel model's denoiser takes the image's 1 channel.* and 1 "
            "layout channel")


def test_the_pixel_sizes_of_dpsynth_model_json() -> None:
    pixel = b.model_info(space="pixel", latent_channels=1)
    assert parse_info(json.dumps(pixel).encode())["space"] == "pixel"
    cases = [
        (b.model_info(space="pixel"), "latent_channels must be channels \\(1\\), not 4"),
        (b.model_info(space="pixel", latent_channels=1, vae_scaling_factor=0.18215),
         "vae_scaling_factor must be 1.0"),
        (b.model_info(space="pixel", latent_channels=1, image_size=128),
         "image_size at most 64, not 128"),
        (b.model_info(space="pixels"), "space"),
        (b.model_info(space=None), "space"),
    ]
    for info, match in cases:
        with pytest.raises(DpsynthError, match=match) as error:
            parse_info(json.dumps(info).encode())
        assert error.value.code == "invalid_model"
    # a latent model keeps its autoencoder's sizes
    latent = b.model_info(space="latent", vae_scaling_factor=0.18215, image_size=128)
    assert parse_info(json.dumps(latent).encode())["vae_scaling_factor"] == 0.18215


def test_a_per_label_pixel_bundle_is_checked_per_denoiser(
        pixel_model: dict[str, bytes], tmp_path: Path) -> None:
    """Per-label bundles (denoisers/<key>/unet/...) have no vae/ in pixel space either, and
    each denoiser must work on the images."""
    per_class = {f"denoisers/{i}/{k}": v for i in ("0", "1") for k, v in pixel_model.items()
                 if k.startswith(("unet/", "class_embedder/"))}
    bundle = {**pixel_model, **per_class}
    assert validate(bundle, tmp_path).info["space"] == "pixel"
    bad = json.loads(pixel_model[UNET]) | {"out_channels": 3}
    refused({**bundle, f"denoisers/1/{UNET}": json.dumps(bad).encode()}, tmp_path,
            "denoisers/1/unet/config.json has out_channels 3")
