"""Pretrain → DP finetune → sample at tiny size; model format and the rng stamp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import (
    FinetuneTraining,
    InvalidSpecError,
    TrainingResult,
    load_dataset,
    model_hash,
    read_model_info,
    sample,
    train,
)
from dpsynth_ml.models.model_io import load_model
from PIL import Image

from .support import IMAGE_SIZE, finetune_spec, seeded


def test_pretrain_writes_a_complete_model_dir(pretrained: TrainingResult) -> None:
    model_dir = pretrained.model_dir
    for part in ("vae", "unet"):
        assert (model_dir / part / "diffusion_pytorch_model.safetensors").is_file()
    assert (model_dir / "scheduler" / "scheduler_config.json").is_file()
    emb = json.loads((model_dir / "class_embedder" / "config.json").read_text())
    assert emb == {"num_embeddings": 11, "embedding_dim": 32, "null_class": 10}
    info = read_model_info(model_dir)
    assert (info.training_kind, info.num_classes, info.null_class) == ("pretrain", 10, 10)
    assert info.class_names[3] == "digit 3" and info.image_size == IMAGE_SIZE
    assert 0.05 < info.vae_scaling_factor < 50
    assert pretrained.steps_completed == info.steps == 12  # (1 VAE + 2 UNet epochs) x 4 batches
    assert not list(model_dir.rglob("*.bin")) and not list(model_dir.rglob("*.pt"))


def test_round_trip_finetune_and_sample(pretrained: TrainingResult, digits_path: Path,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = train(finetune_spec(dp_steps=3), dataset_path=digits_path, out_dir=tmp_path / "ft",
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    assert result.rng == "test" and read_model_info(result.model_dir).rng == "test"
    info = read_model_info(result.model_dir)
    assert info.training_kind == "finetune" and info.steps == 3
    assert info.extra["base_model_hash"] == model_hash(pretrained.model_dir)

    def no_pickle(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle-based torch.load used")

    monkeypatch.setattr(torch, "load", no_pickle)
    load_model(result.model_dir)  # safetensors only
    progress: list[tuple[int, int]] = []
    out = tmp_path / "samples"
    samples = sample(result.model_dir, samples_per_class=2, sampler="ddim", steps=4,
                     guidance_scale=2.0, seed=0, out_dir=out, classes=[0, 7],
                     progress=lambda done, total: progress.append((done, total)))
    assert dict(samples.counts) == {"digit 0": 2, "digit 7": 2} and samples.total == 4
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == [
        "digit_0/0.png", "digit_0/1.png", "digit_7/0.png", "digit_7/1.png"]
    image = Image.open(out / "digit_7" / "1.png")
    assert image.mode == "L" and image.size == (IMAGE_SIZE, IMAGE_SIZE)
    assert progress[-1] == (4, 4)


def test_sampling_is_reproducible_by_seed_and_ddpm_works(pretrained: TrainingResult,
                                                          tmp_path: Path) -> None:
    def pixels(seed: int, sampler: str, name: str) -> np.ndarray:
        sample(pretrained.model_dir, samples_per_class=1, sampler=sampler,  # type: ignore[arg-type]
               steps=3, guidance_scale=1.0, seed=seed, out_dir=tmp_path / name, classes=[1])
        return np.array(Image.open(tmp_path / name / "digit_1" / "0.png"))

    assert np.array_equal(pixels(5, "ddpm", "a"), pixels(5, "ddpm", "b"))
    assert not np.array_equal(pixels(5, "ddpm", "a"), pixels(6, "ddpm", "c"))


def test_without_injected_generator_the_model_is_stamped_os(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    result = train(finetune_spec(dp_steps=1), dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir)
    assert result.rng == "os" and read_model_info(result.model_dir).rng == "os"


def test_os_seeded_runs_differ_even_with_the_same_spec_seed(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    hashes = set()
    for name in ("a", "b"):
        # a finetune has no seed: its randomness is the OS's, never the spec's
        result = train(finetune_spec(dp_steps=1), dataset_path=digits_path,
                       out_dir=tmp_path / name, base_model_dir=pretrained.model_dir)
        hashes.add(model_hash(result.model_dir / "unet"))
    assert len(hashes) == 2


def test_specs_and_datasets_are_validated(digits_path: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError):
        FinetuneTraining(privacy=None)  # type: ignore[arg-type]  # no privacy block
    with pytest.raises(InvalidSpecError):
        finetune_spec(dp_sample_rate=0.0)
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((2, 4, 4, 1), np.float32), labels=np.zeros(2, np.int64),
             class_names=np.array(["a"]))
    with pytest.raises(InvalidSpecError):
        load_dataset(bad)
    dataset = load_dataset(digits_path)
    assert dataset.images.dtype == np.uint8 and len(dataset) == 100
