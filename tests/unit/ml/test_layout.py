"""Layout conditioning (DP-DocLDM): masks are encoded by the model's own VAE and concatenated
to the noisy latent; the prediction depends on the layout; pretrain and DP finetune run
with masks and refuse data without them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import InvalidSpecError, PretrainTraining, TrainingResult, read_model_info, train
from dpsynth_ml.models.architectures import (
    ConditionalDenoiser,
    build_bundle,
    encode_layouts,
    plan_model,
)
from dpsynth_ml.models.model_io import load_model

from .support import IMAGE_SIZE, finetune_spec, seeded, write_digits

N = 40


def _line_masks(n: int, size: int = IMAGE_SIZE, seed: int = 0) -> np.ndarray:
    """Document-like masks: 1 to 4 horizontal text lines of random extent, 255 = text."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((n, size, size, 1), dtype=np.uint8)
    for mask in masks:
        for _ in range(rng.integers(1, 5)):
            row, start = rng.integers(0, size - 2), rng.integers(0, size // 2)
            mask[row:row + 2, start:start + rng.integers(4, size - start + 1)] = 255
    return masks


@pytest.fixture(scope="module")
def masked_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    plain = write_digits(root / "plain.npz", n=N)
    with np.load(plain) as npz:
        arrays = {k: npz[k] for k in npz.files}
    path = root / "masked.npz"
    np.savez(path, masks=_line_masks(N), **arrays)
    return path


@pytest.fixture(scope="module")
def layout_model(tmp_path_factory: pytest.TempPathFactory, masked_digits: Path) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1,
                        batch_size=20, learning_rate=1e-3, layout_conditioning=True)
    return train(spec, dataset_path=masked_digits, out_dir=tmp_path_factory.mktemp("lpre"))


def test_the_prediction_depends_on_the_layout() -> None:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE,
                        layout_conditioning=True)
    torch.manual_seed(0)
    bundle = build_bundle(plan_model(spec), num_classes=10)
    assert bundle.unet.config["in_channels"] == 2 * bundle.unet.config["out_channels"] == 8
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([10, 700]), torch.tensor([1, 2])
    first, second = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        a, b = denoiser(x, t, y, layout=first), denoiser(x, t, y, layout=second)
        again = denoiser(x, t, y, layout=first)
    assert torch.equal(a, again)
    assert (a - b).abs().flatten(1).amax(dim=1).min() > 1e-4  # each example moved
    with pytest.raises(InvalidSpecError, match="layout is required"):
        denoiser(x, t, y)


def test_layout_pretrain_records_the_layout_channels(layout_model: TrainingResult,
                                                     masked_digits: Path) -> None:
    info = read_model_info(layout_model.model_dir)
    assert info.extra["layout_channels"] == info.latent_channels == 4
    bundle, info = load_model(layout_model.model_dir)
    assert bundle.layout_channels == 4
    masks = _line_masks(3, size=8, seed=1)  # other sizes are resized like images
    encoded = encode_layouts(bundle, info, masks)
    assert encoded.shape == (3, 4, 8, 8)
    # The same frozen VAE as for images: posterior mean x the model's scaling factor.
    x = torch.from_numpy(masks).permute(0, 3, 1, 2).float() / 127.5 - 1
    x = torch.nn.functional.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear",
                                        align_corners=False, antialias=True)
    with torch.no_grad():
        direct = bundle.vae.encode(x).latent_dist.mean * info.vae_scaling_factor
    torch.testing.assert_close(encoded, direct)
    assert not torch.allclose(encoded[0], encoded[1])


def test_layout_finetune_runs_on_private_masks(layout_model: TrainingResult,
                                               masked_digits: Path, tmp_path: Path) -> None:
    spec = finetune_spec(trainable="attention", class_map={i: i for i in range(10)},
                         dp_steps=2, dp_sample_rate=0.25, checkpoint_every=10)
    result = train(spec, dataset_path=masked_digits, out_dir=tmp_path,
                   base_model_dir=layout_model.model_dir, _test_generator=seeded())
    assert result.steps_completed == 2
    assert read_model_info(result.model_dir).extra["layout_channels"] == 4
    before, _ = load_model(layout_model.model_dir)
    after, _ = load_model(result.model_dir)
    changed = [k for k, v in after.unet.state_dict().items()
               if not torch.equal(v, before.unet.state_dict()[k])]
    assert changed


def test_layout_models_refuse_data_without_masks(layout_model: TrainingResult,
                                                 tmp_path: Path) -> None:
    plain = write_digits(tmp_path / "plain.npz", n=N)
    with pytest.raises(InvalidSpecError, match="mask"):
        train(PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1,
                           layout_conditioning=True),
              dataset_path=plain, out_dir=tmp_path / "pre")
    with pytest.raises(InvalidSpecError, match="mask"):
        train(finetune_spec(class_map={i: i for i in range(10)}, dp_steps=1),
              dataset_path=plain, out_dir=tmp_path / "ft",
              base_model_dir=layout_model.model_dir, _test_generator=seeded())
