"""Pixel-space models (small images, no autoencoder): the spec's ``space``, a pretrain with no
VAE phase and no ``vae/``, DP finetunes (whole-dataset and per-label) and sampling from them,
and latent models written before ``space`` existed still loading as latent."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import (
    DpSpec,
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    PretrainTraining,
    RecordLevel,
    TrainingResult,
    read_model_info,
    sample,
    train,
)
from dpsynth_ml.models.architectures import (
    ConditionalDenoiser,
    build_bundle,
    encode_layouts,
    plan_model,
)
from dpsynth_ml.models.codec import (
    decode_samples,
    encode_records,
    model_to_pixels,
    pixels_to_model,
)
from dpsynth_ml.models.model_io import INFO_FILE, load_model, load_model_denoiser, save_model
from dpsynth_ml.spec import Architecture, ModelInfo
from PIL import Image

from .dp_support import one_thread
from .support import IMAGE_SIZE, changed_parameters, finetune_spec, model_state, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]

UNET2D = {"block_out_channels": [32, 64], "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
          "up_block_types": ["AttnUpBlock2D", "UpBlock2D"], "layers_per_block": 1,
          "norm_num_groups": 8, "attention_head_dim": 8}


@pytest.fixture(scope="module")
def pixel_model(tmp_path_factory: pytest.TempPathFactory, digits_path: Path) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=2, batch_size=25,
                            learning_rate=1e-3, seed=0, space="pixel")
    return train(spec, dataset_path=digits_path, out_dir=tmp_path_factory.mktemp("pixel"))


def test_the_space_defaults_to_latent_and_pixel_takes_small_images_only() -> None:
    assert PretrainTraining().space == "latent"
    assert PretrainTraining(space="pixel", image_size=64).space == "pixel"
    with pytest.raises(InvalidSpecError, match="at most 64x64"):
        PretrainTraining(space="pixel", image_size=68)
    PretrainTraining(space="latent", image_size=128)  # latent models stay for large images
    with pytest.raises(InvalidSpecError, match="unknown space"):
        PretrainTraining(space="voxel")  # type: ignore[arg-type]
    with pytest.raises(InvalidSpecError, match="no autoencoder"):
        PretrainTraining(space="pixel", preset="custom", architecture=Architecture(
            unet_class="UNet2DModel", unet=UNET2D, vae={"latent_channels": 4}))
    with pytest.raises(InvalidSpecError, match="latent channels"):
        ModelInfo(format_version=1, preset="tiny", image_size=16, channels=1,
                  latent_channels=4, vae_scaling_factor=1.0, num_classes=2,
                  class_names=("a", "b"), null_class=2, rng="test",
                  training_kind="pretrain", steps=0, space="pixel")


def test_pixel_plans_size_the_unet_to_the_image() -> None:
    plan = plan_model(PretrainTraining(preset="small", image_size=32, channels=3,
                                       space="pixel"))
    assert plan.vae_config is None and plan.vae_epochs == 0 and plan.space == "pixel"
    assert (plan.unet_config["sample_size"], plan.unet_config["in_channels"],
            plan.unet_config["out_channels"], plan.latent_channels) == (32, 3, 3, 3)
    custom = plan_model(PretrainTraining(preset="custom", image_size=IMAGE_SIZE, space="pixel",
                                         architecture=Architecture(unet_class="UNet2DModel",
                                                                   unet=UNET2D)))
    assert custom.unet_class == "UNet2DModel" and custom.vae_config is None
    assert (custom.unet_config["sample_size"], custom.unet_config["in_channels"]) == (16, 1)
    # the UNet must downsample the image evenly (8 here: four blocks)
    deep = {**UNET2D, "block_out_channels": [32, 32, 64, 64],
            "down_block_types": ["DownBlock2D"] * 4, "up_block_types": ["UpBlock2D"] * 4}
    with pytest.raises(InvalidSpecError, match="downsampling factor 8"):
        plan_model(PretrainTraining(preset="custom", image_size=20, space="pixel",
                                    architecture=Architecture(unet_class="UNet2DModel",
                                                              unet=deep)))
    with pytest.raises(InvalidSpecError, match="in_channels"):
        plan_model(PretrainTraining(preset="custom", image_size=16, space="pixel",
                                    architecture=Architecture(unet_class="UNet2DModel",
                                                              unet={**UNET2D, "in_channels": 2})))


def test_pixel_pretrain_writes_no_vae_and_round_trips(pixel_model: TrainingResult,
                                                      tmp_path: Path) -> None:
    model_dir = pixel_model.model_dir
    assert not (model_dir / "vae").exists()
    assert (model_dir / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    assert (model_dir / "class_embedder" / "config.json").is_file()
    assert json.loads((model_dir / INFO_FILE).read_text())["space"] == "pixel"
    info = read_model_info(model_dir)
    assert (info.space, info.latent_channels, info.vae_scaling_factor) == ("pixel", 1, 1.0)
    assert info.extra["layout_channels"] == 0
    assert pixel_model.steps_completed == info.steps == 8  # 2 UNet epochs x 4, no VAE phase
    bundle, loaded = load_model(model_dir)
    assert bundle.vae is None and bundle.space == "pixel" and loaded == info
    assert bundle.unet.config["sample_size"] == IMAGE_SIZE
    assert bundle.unet.config["in_channels"] == bundle.unet.config["out_channels"] == 1
    copy = save_model(bundle, loaded, tmp_path / "copy")
    assert not (copy / "vae").exists() and read_model_info(copy) == info
    before, after = model_state(model_dir), model_state(copy)
    assert before.keys() == after.keys() and not changed_parameters(before, after)
    assert not any(k.startswith("vae.") for k in before)


def test_the_pixel_codec_maps_unit_images_to_minus_one_one(pixel_model: TrainingResult) -> None:
    bundle, info = load_model(pixel_model.model_dir)
    images = np.array([[[0], [255]], [[51], [102]]], dtype=np.uint8)[None].repeat(3, axis=0)
    encoded = encode_records(bundle, info, images)
    assert encoded.shape == (3, 1, IMAGE_SIZE, IMAGE_SIZE)
    assert encoded.min() >= -1.0 and encoded.max() <= 1.0
    unit = torch.rand(2, 1, 4, 4)
    torch.testing.assert_close(pixels_to_model(unit), unit * 2 - 1)
    torch.testing.assert_close(model_to_pixels(pixels_to_model(unit)), unit)
    decoded = decode_samples(bundle, info, torch.randn(2, 1, IMAGE_SIZE, IMAGE_SIZE) * 3)
    assert decoded.shape == (2, 1, IMAGE_SIZE, IMAGE_SIZE)
    assert decoded.min() >= 0.0 and decoded.max() <= 1.0
    with pytest.raises(InvalidSpecError, match="space 'latent'"):
        encode_records(bundle, dataclasses.replace(info, space="latent"), images)


def test_pixel_layout_conditioning_concatenates_the_mask() -> None:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, layout_conditioning=True,
                            space="pixel")
    torch.manual_seed(0)
    plan = plan_model(spec)
    bundle = build_bundle(plan, num_classes=10)
    assert bundle.vae is None and bundle.layout_channels == 1
    info = ModelInfo(format_version=1, preset="tiny", image_size=IMAGE_SIZE, channels=1,
                     latent_channels=1, vae_scaling_factor=1.0, num_classes=10,
                     class_names=tuple(str(i) for i in range(10)), null_class=10, rng="test",
                     training_kind="pretrain", steps=0, space="pixel")
    masks = np.zeros((2, 8, 8, 1), dtype=np.uint8)
    masks[0, 2:4] = 255
    layout = encode_layouts(bundle, info, masks)
    assert layout.shape == (2, 1, IMAGE_SIZE, IMAGE_SIZE) and layout.min() == -1.0
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
    with torch.no_grad():
        out = denoiser(torch.randn(2, 1, IMAGE_SIZE, IMAGE_SIZE), torch.tensor([5, 500]),
                       torch.tensor([1, 2]), layout=layout)
    assert out.shape == (2, 1, IMAGE_SIZE, IMAGE_SIZE)


def test_dp_finetune_from_a_pixel_model_stays_pixel(pixel_model: TrainingResult,
                                                    digits_path: Path, tmp_path: Path) -> None:
    result = train(finetune_spec(dp_steps=2, checkpoint_every=1), dataset_path=digits_path,
                   out_dir=tmp_path, base_model_dir=pixel_model.model_dir,
                   _test_generator=seeded())
    assert result.steps_completed == 2
    info = read_model_info(result.model_dir)
    assert (info.space, info.training_kind, info.latent_channels) == ("pixel", "finetune", 1)
    assert not (result.model_dir / "vae").exists()
    checkpoints = sorted((tmp_path / "checkpoints").iterdir())
    assert checkpoints and not any((c / "vae").exists() for c in checkpoints)
    assert read_model_info(checkpoints[0]).space == "pixel"
    changed = changed_parameters(model_state(pixel_model.model_dir),
                                 model_state(result.model_dir))
    assert any(k.startswith("unet.") for k in changed)
    out = tmp_path / "samples"
    samples = sample(result.model_dir, samples_per_class=2, sampler="ddim", steps=3,
                     guidance_scale=2.0, seed=0, out_dir=out, classes=[0, 7])
    assert dict(samples.counts) == {"digit 0": 2, "digit 7": 2}
    image = Image.open(out / "digit_7" / "1.png")
    assert image.mode == "L" and image.size == (IMAGE_SIZE, IMAGE_SIZE)


def test_subject_level_finetune_from_a_pixel_model(pixel_model: TrainingResult,
                                                   digits_path: Path, tmp_path: Path) -> None:
    """User-level DP (subjects split across micro-batches) trains a pixel model too."""
    with np.load(digits_path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["subjects"] = np.arange(arrays["images"].shape[0]) % 7  # up to ~20 images each
    data = tmp_path / "subjects.npz"
    np.savez(data, **arrays)
    spec = finetune_spec(privacy_unit="subject", max_images_per_subject=3, dp_steps=2,
                         dp_sample_rate=0.5, dp_expected_batch_size=3, checkpoint_every=2,
                         max_physical_batch_size=4)
    result = train(spec, dataset_path=data, out_dir=tmp_path / "ft",
                   base_model_dir=pixel_model.model_dir, _test_generator=seeded())
    assert result.steps_completed == 2
    info = read_model_info(result.model_dir)
    assert info.space == "pixel" and not (result.model_dir / "vae").exists()
    changed = changed_parameters(model_state(pixel_model.model_dir),
                                 model_state(result.model_dir))
    assert any(k.startswith("unet.") for k in changed)


def test_per_label_finetune_from_a_pixel_model(pixel_model: TrainingResult, digits_path: Path,
                                               tmp_path: Path) -> None:
    keep = np.flatnonzero(np.load(digits_path)["labels"] < 2)
    with np.load(digits_path) as npz:
        images, labels = npz["images"][keep], npz["labels"][keep]
    data = tmp_path / "two.npz"
    np.savez(data, images=images, labels=labels, class_names=np.array(["zero", "one"]))
    dp = DpSpec(noise_multiplier=1.0, sample_rate=0.3, expected_batch_size=3,
                max_grad_norm=1.0, steps=2)
    spec = FinetuneTraining(image_size=IMAGE_SIZE, num_classes=2, max_physical_batch_size=4,
                            checkpoint_every=2, learning_rate=1e-3,
                            privacy=PerLabel({"zero": RecordLevel(dp), "one": RecordLevel(dp)}))
    result = train(spec, dataset_path=data, out_dir=tmp_path / "ft",
                   base_model_dir=pixel_model.model_dir, _test_generator=seeded())
    assert dict(result.steps_by_partition) == {"zero": 2, "one": 2}
    info = read_model_info(result.model_dir)
    assert info.space == "pixel" and info.extra["per_label"] is True
    assert not any(p.name == "vae" for p in result.model_dir.rglob("*"))
    one, one_info = load_model_denoiser(result.model_dir, "one")
    assert one.vae is None and one_info.space == "pixel"
    out = tmp_path / "samples"
    samples = sample(result.model_dir, samples_per_class=1, sampler="ddim", steps=2,
                     guidance_scale=1.0, seed=0, out_dir=out)
    assert dict(samples.counts) == {"zero": 1, "one": 1}
    pixels = np.array(Image.open(out / "one" / "0.png"))
    assert pixels.shape == (IMAGE_SIZE, IMAGE_SIZE) and pixels.dtype == np.uint8


def test_a_model_info_without_space_loads_as_latent(pretrained: TrainingResult,
                                                    tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(pretrained.model_dir, old)
    raw = json.loads((old / INFO_FILE).read_text())
    raw.pop("space", None)  # as every model written before pixel space existed
    (old / INFO_FILE).write_text(json.dumps(raw, indent=2, sort_keys=True))
    info = read_model_info(old)
    assert info.space == "latent" and info == read_model_info(pretrained.model_dir)
    bundle, _ = load_model(old)
    assert bundle.vae is not None and bundle.space == "latent"
    # a pixel model must not carry a VAE, nor a latent model lack one
    raw["space"], raw["latent_channels"], raw["vae_scaling_factor"] = "pixel", 1, 1.0
    (old / INFO_FILE).write_text(json.dumps(raw))
    with pytest.raises(InvalidSpecError, match="no vae"):
        load_model(old)
    raw["space"] = "voxel"
    (old / INFO_FILE).write_text(json.dumps(raw))
    with pytest.raises(InvalidSpecError, match="unknown model space"):
        read_model_info(old)
