"""Layout generators (issue 3, item 5): a model trained on a dataset's layout masks in place
of its images (``target: masks``), DP-finetuned like any finetune, sampled into binary masks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import InvalidSpecError, PretrainTraining, TrainingResult, read_model_info, train
from dpsynth_ml.models.architectures import encode_images
from dpsynth_ml.models.model_io import load_model
from dpsynth_ml.sampling.generate import LayoutSet, is_layout_generator, sample_layouts
from dpsynth_ml.training.finetune import loop as ft_loop

from .recording import RecordingSampler, recording  # noqa: F401  (fixture)
from .support import IMAGE_SIZE, finetune_spec, seeded, write_digits

N = 40


def _block_masks(n: int, seed: int = 0) -> np.ndarray:
    """Masks unlike the digits: 1-3 full-width text bands, 255 = text."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((n, IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)
    for mask in masks:
        for _ in range(rng.integers(1, 4)):
            row = rng.integers(0, IMAGE_SIZE - 3)
            mask[row:row + 3, 1:-1] = 255
    return masks


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layoutgen")
    with np.load(write_digits(root / "plain.npz", n=N)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["images"] = 255 - arrays["images"]  # far from the masks: inverted digits
    path = root / "masked.npz"
    np.savez(path, masks=_block_masks(N), **arrays)
    return path


@pytest.fixture(scope="module")
def mask_pretrained(tmp_path_factory: pytest.TempPathFactory, masked: Path) -> TrainingResult:
    """A public layout generator: pretrained on the masks (as a public dataset would be)."""
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=2,
                        batch_size=20, learning_rate=1e-3, target="masks")
    return train(spec, dataset_path=masked, out_dir=tmp_path_factory.mktemp("mpre"))


def test_pretrain_on_masks_records_the_target(mask_pretrained: TrainingResult) -> None:
    info = read_model_info(mask_pretrained.model_dir)
    assert info.extra["target"] == "masks" and is_layout_generator(info)
    assert info.channels == 1 and not info.extra.get("layout_channels")


def test_a_masks_finetune_trains_on_the_encoded_masks(
        recording: None, monkeypatch: pytest.MonkeyPatch, masked: Path,  # noqa: F811
        mask_pretrained: TrainingResult, tmp_path: Path) -> None:
    """The per-example inputs the DP engine sees are the encoded masks of the Poisson batch,
    not the images: same sampler, same clipping, only the records differ."""
    seen: list[torch.Tensor] = []
    real = ft_loop.per_sample_diffusion_loss

    def spy(denoiser, scheduler, latents, labels, generator, layout=None,  # type: ignore[no-untyped-def]
            timesteps="uniform"):
        seen.append(latents.detach().clone())
        return real(denoiser, scheduler, latents, labels, generator, layout=layout,
                    timesteps=timesteps)

    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", spy)
    spec = finetune_spec(target="masks", num_classes=10, dp_steps=3, dp_sample_rate=0.3,
                         checkpoint_every=3, max_physical_batch_size=64)
    result = train(spec, dataset_path=masked, out_dir=tmp_path / "ft",
                   base_model_dir=mask_pretrained.model_dir, _test_generator=seeded())
    assert result.steps_completed == 3
    assert read_model_info(result.model_dir).extra["target"] == "masks"

    bundle, info = load_model(mask_pretrained.model_dir)
    with np.load(masked) as npz:
        masks, images = npz["masks"], npz["images"]
    kwargs = dict(image_size=info.image_size, channels=info.channels,
                  scaling_factor=info.vae_scaling_factor)
    encoded_masks = encode_images(bundle.vae, masks, **kwargs)  # type: ignore[arg-type]
    encoded_images = encode_images(bundle.vae, images, **kwargs)  # type: ignore[arg-type]
    batches = RecordingSampler.instances[0].batches
    # one micro-batch per logical step: the batch, then padding rows (zero latents, loss
    # masked to 0) up to the step's fixed, public row count (dp.padding)
    assert len(batches) == len(seen) == 3 and sum(b.numel() for b in batches) >= 2
    for batch, latents in zip(batches, seen, strict=True):
        real, padding = latents[:len(batch)], latents[len(batch):]
        torch.testing.assert_close(real, encoded_masks[batch], rtol=1e-4, atol=1e-4)
        assert not batch.numel() or not torch.allclose(real, encoded_images[batch], atol=1e-2)
        assert len(padding) and not padding.any()


def test_a_masks_finetune_needs_masks(mask_pretrained: TrainingResult, tmp_path: Path) -> None:
    plain = write_digits(tmp_path / "plain.npz", n=N)
    with pytest.raises(InvalidSpecError, match="layout masks"):
        train(finetune_spec(target="masks", num_classes=10), dataset_path=plain,
              out_dir=tmp_path / "ft", base_model_dir=mask_pretrained.model_dir,
              _test_generator=seeded())


def test_target_masks_is_neither_layout_conditioned_nor_per_label() -> None:
    with pytest.raises(InvalidSpecError, match="layout generator"):
        PretrainTraining(target="masks", layout_conditioning=True)
    with pytest.raises(InvalidSpecError, match="unknown target"):
        PretrainTraining(target="pixels")  # type: ignore[arg-type]


def test_sample_layouts_draws_binary_masks_per_class(mask_pretrained: TrainingResult) -> None:
    counts = {"digit 3": 2, "digit 7": 3}
    layouts = sample_layouts(mask_pretrained.model_dir, counts=counts, seed=5, steps=3,
                             batch_size=2)
    assert isinstance(layouts, LayoutSet)
    assert layouts.masks.shape == (5, IMAGE_SIZE, IMAGE_SIZE, 1)
    assert layouts.masks.dtype == np.uint8
    assert set(np.unique(layouts.masks)) <= {0, 255}
    assert layouts.class_names is not None and layouts.labels is not None
    assert [layouts.class_names[i] for i in layouts.labels] == ["digit 3"] * 2 + ["digit 7"] * 3
    assert layouts.pool("digit 7").tolist() == [2, 3, 4]
    again = sample_layouts(mask_pretrained.model_dir, counts=counts, seed=5, steps=3,
                           batch_size=2)
    np.testing.assert_array_equal(layouts.masks, again.masks)  # a function of the seed


def test_sample_layouts_refuses_an_image_model(pretrained: TrainingResult) -> None:
    with pytest.raises(InvalidSpecError, match="target 'masks'"):
        sample_layouts(pretrained.model_dir, counts={"digit 0": 1}, seed=0, steps=2)
