"""Every ML phase on the worker's device (issue 18): one test per phase that runs only with
CUDA (skipped cleanly without it) and asserts the phase's modules actually ran on the GPU
(a global forward hook records the device of every module that ran) and that its result
records the device; plus CPU tests that the device argument threads through without
changing anything (``device="cpu"`` gives the default's output bit for bit)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import (
    DpSpec,
    ImageDataset,
    PerLabel,
    PretrainTraining,
    RecordLevel,
    TrainingResult,
    evaluate_corpus,
    load_dataset,
    model_hash,
    read_model_info,
    sample,
    train,
    train_placed,
)
from dpsynth_ml.parallel.placement import train_on_device

from .support import IMAGE_SIZE, finetune_spec, seeded, write_digits

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = "cuda:0"


@contextmanager
def devices_seen() -> Iterator[set[str]]:
    """The device types of the parameters of every module whose forward ran in the block."""
    seen: set[str] = set()

    def hook(module: torch.nn.Module, args: object, output: object) -> None:
        for param in module.parameters(recurse=False):
            seen.add(param.device.type)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _pretrain_spec(**overrides: object) -> PretrainTraining:
    fields: dict[str, object] = dict(preset="tiny", image_size=IMAGE_SIZE, epochs=1,
                                     batch_size=25, learning_rate=1e-3, seed=0)
    fields.update(overrides)
    return PretrainTraining(**fields)  # type: ignore[arg-type]


# --- GPU: one test per phase ----------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("space", ["latent", "pixel"])
def test_pretrain_runs_on_the_gpu(space: str, digits_path: Path, tmp_path: Path) -> None:
    with devices_seen() as seen:
        result = train_placed(CUDA, _pretrain_spec(space=space), dataset_path=digits_path,
                              out_dir=tmp_path)
    assert seen == {"cuda"}
    assert result.device == CUDA
    info = read_model_info(result.model_dir)
    assert info.extra["device"] == CUDA and info.extra["autocast"] == "bfloat16"


@needs_cuda
def test_whole_dataset_finetune_runs_on_the_gpu(digits_path: Path, pretrained: TrainingResult,
                                                tmp_path: Path) -> None:
    with devices_seen() as seen:  # the VAE encoding of the private set included
        result = train_placed(CUDA, finetune_spec(dp_steps=3, checkpoint_every=3),
                              dataset_path=digits_path, out_dir=tmp_path,
                              base_model_dir=pretrained.model_dir)
    assert seen == {"cuda"} and result.device == CUDA and result.steps_completed == 3


@needs_cuda
def test_the_dp_loop_gathers_its_rows_on_the_gpu(digits_path: Path,
                                                 pretrained: TrainingResult,
                                                 tmp_path: Path) -> None:
    """The encoded private examples stay on the GPU: every micro-batch the loop gathers
    (padding rows included) is built there, not copied from the host."""
    from dpsynth_ml.dp import padding

    gathered: list[str] = []
    original = padding.gather_rows

    def spy(source: torch.Tensor, indices: torch.Tensor, **kw: object) -> torch.Tensor:
        out = original(source, indices, **kw)  # type: ignore[arg-type]
        if source.dtype.is_floating_point:  # the latents (labels are gathered on the host)
            gathered.append(out.device.type)
        return out

    import dpsynth_ml.training.finetune.loop as loop

    loop_gather = loop.gather_rows
    loop.gather_rows = spy  # type: ignore[assignment]
    try:
        train_placed(CUDA, finetune_spec(dp_steps=2, checkpoint_every=2),
                     dataset_path=digits_path, out_dir=tmp_path,
                     base_model_dir=pretrained.model_dir)
    finally:
        loop.gather_rows = loop_gather  # type: ignore[assignment]
    assert gathered and set(gathered) == {"cuda"}


@needs_cuda
def test_per_label_finetune_runs_on_the_gpu(digits_path: Path, pretrained: TrainingResult,
                                            tmp_path: Path) -> None:
    dp = DpSpec(noise_multiplier=1.0, sample_rate=0.5, expected_batch_size=4,
                max_grad_norm=1.0, steps=2)
    names = load_dataset(digits_path).class_names
    spec = finetune_spec(privacy=PerLabel({c: RecordLevel(dp) for c in names}),
                         checkpoint_every=2)
    with devices_seen() as seen:
        result = train_placed(CUDA, spec, dataset_path=digits_path, out_dir=tmp_path,
                              base_model_dir=pretrained.model_dir)
    assert seen == {"cuda"} and result.device == CUDA
    assert set(result.steps_by_partition.values()) == {2}


@needs_cuda
def test_subject_level_finetune_runs_on_the_gpu(tmp_path: Path,
                                                pretrained: TrainingResult) -> None:
    path = write_digits(tmp_path / "digits.npz")
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["subjects"] = np.arange(len(arrays["labels"])) % 20
    np.savez(path, **arrays)
    spec = finetune_spec(privacy_unit="subject", max_images_per_subject=3,
                         dp_sample_rate=0.2, dp_expected_batch_size=4, dp_steps=2,
                         checkpoint_every=2)
    with devices_seen() as seen:
        result = train_placed(CUDA, spec, dataset_path=path, out_dir=tmp_path / "out",
                              base_model_dir=pretrained.model_dir)
    assert seen == {"cuda"} and result.device == CUDA and result.steps_completed == 2


@needs_cuda
def test_layout_generator_finetune_runs_on_the_gpu(tmp_path: Path) -> None:
    path = write_digits(tmp_path / "digits.npz", n=40)
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    masks = np.zeros((40, IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)
    masks[:, 4:8, 1:-1] = 255
    np.savez(path, masks=masks, **arrays)
    base = train_placed(CUDA, _pretrain_spec(target="masks", batch_size=20),
                        dataset_path=path, out_dir=tmp_path / "pre")
    with devices_seen() as seen:
        result = train_placed(CUDA, finetune_spec(target="masks", dp_steps=2,
                                                  checkpoint_every=2),
                              dataset_path=path, out_dir=tmp_path / "ft",
                              base_model_dir=base.model_dir)
    assert seen == {"cuda"} and base.device == CUDA and result.device == CUDA


@needs_cuda
def test_sampling_runs_on_the_gpu(pretrained: TrainingResult, tmp_path: Path) -> None:
    with devices_seen() as seen:
        result = sample(pretrained.model_dir, samples_per_class=3, sampler="ddpm", steps=3,
                        guidance_scale=2.0, seed=1, out_dir=tmp_path, device=CUDA)
    assert seen == {"cuda"} and result.device == CUDA
    assert result.total == 3 * 10
    again = sample(pretrained.model_dir, samples_per_class=3, sampler="ddpm", steps=3,
                   guidance_scale=2.0, seed=1, out_dir=tmp_path / "again", device=CUDA)
    assert again.counts == result.counts  # seeded on the GPU too (round-off aside)


@needs_cuda
def test_evaluation_runs_on_the_gpu(digits_path: Path) -> None:
    data = load_dataset(digits_path)
    with devices_seen() as seen:
        result = evaluate_corpus(*_sets(data), classifiers=["cnn"], seed=0, device=CUDA)
    assert seen == {"cuda"} and result.device == CUDA
    model = result.classifiers["cnn"]
    assert next(model.parameters()).device.type == "cuda"


# --- CPU: the device argument threads through and changes nothing --------------------------


def _sets(data: ImageDataset) -> tuple[ImageDataset, ImageDataset, ImageDataset]:
    half = len(data) // 2

    def part(sl: slice) -> ImageDataset:
        return dataclasses.replace(data, images=data.images[sl], labels=data.labels[sl])

    return part(slice(0, half)), part(slice(0, half)), part(slice(half, None))


def test_sampling_on_an_explicit_cpu_is_the_default(pretrained: TrainingResult,
                                                   tmp_path: Path) -> None:
    kwargs = dict(samples_per_class=2, sampler="ddpm", steps=2, guidance_scale=2.0, seed=3,
                  classes=[0, 7])
    default = sample(pretrained.model_dir, out_dir=tmp_path / "a", **kwargs)  # type: ignore[arg-type]
    explicit = sample(pretrained.model_dir, out_dir=tmp_path / "b", device="cpu",
                      **kwargs)  # type: ignore[arg-type]
    assert default.device == explicit.device == "cpu"
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert len(files) == 4
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_evaluation_on_an_explicit_cpu_is_the_default(digits_path: Path) -> None:
    sets = _sets(load_dataset(digits_path))
    default = evaluate_corpus(*sets, classifiers=["logreg"], seed=0)
    explicit = evaluate_corpus(*sets, classifiers=["logreg"], seed=0, device="cpu")
    assert default.device == explicit.device == "cpu"
    assert default.document == explicit.document


def test_a_pretrain_placed_on_the_cpu_is_the_plain_one(digits_path: Path,
                                                       tmp_path: Path) -> None:
    spec = _pretrain_spec(epochs=1, batch_size=50)
    plain = train(spec, dataset_path=digits_path, out_dir=tmp_path / "plain")
    placed = train_on_device("cpu", spec, dataset_path=digits_path, out_dir=tmp_path / "on")
    assert plain.device == placed.device == "cpu"
    for part in ("vae", "unet"):
        assert model_hash(plain.model_dir / part) == model_hash(placed.model_dir / part)


def test_a_per_label_finetune_placed_on_the_cpu_records_it(
        digits_path: Path, pretrained: TrainingResult, tmp_path: Path) -> None:
    dp = DpSpec(noise_multiplier=1.0, sample_rate=0.5, expected_batch_size=4,
                max_grad_norm=1.0, steps=1)
    names = load_dataset(digits_path).class_names[:2]
    path = tmp_path / "two.npz"
    data = load_dataset(digits_path)
    keep = data.labels < 2
    np.savez(path, images=data.images[keep], labels=data.labels[keep],
             class_names=np.array(names))
    spec = finetune_spec(privacy=PerLabel({c: RecordLevel(dp) for c in names}),
                         checkpoint_every=1, num_classes=2)
    result = train_on_device("cpu", spec, dataset_path=path, out_dir=tmp_path / "out",
                             base_model_dir=pretrained.model_dir, _test_generator=seeded(1))
    assert result.device == "cpu" and dict(result.steps_by_partition) == dict.fromkeys(names, 1)


def test_encoded_examples_stay_on_an_accelerator_only_when_they_fit() -> None:
    """``resident``: the host for a CPU job or a set over the cap (no accelerator call is
    made then); ``gather_rows`` builds its rows on the source's device, padding included."""
    from dpsynth_ml.dp.padding import gather_rows
    from dpsynth_ml.parallel.distributed import resident

    latents = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert resident(latents, torch.device("cpu")).device.type == "cpu"
    # over the cap: kept on the host even for an accelerator job
    assert resident(latents, torch.device("cuda:0"), max_bytes=8).device.type == "cpu"
    rows = gather_rows(latents, torch.tensor([2, -1, 0]), fill=0)
    assert rows.device == latents.device
    assert torch.equal(rows, torch.stack([latents[2], torch.zeros(4), latents[0]]))
    empty = gather_rows(latents[:0], torch.tensor([-1, -1]), fill=7)
    assert torch.equal(empty, torch.full((2, 4), 7.0))
