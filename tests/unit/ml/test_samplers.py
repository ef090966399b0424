"""Sampling options: DDPM / DDIM / DPM-Solver++, batch size, seed, images per second,
per-label bundles and layout conditioning."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler
from dpsynth_ml import (
    InvalidSpecError,
    ModelInfo,
    PretrainTraining,
    SampleResult,
    TrainingResult,
    read_model_info,
    sample,
)
from dpsynth_ml.models.architectures import ConditionalDenoiser, build_bundle, plan_model
from dpsynth_ml.models.model_io import load_model, save_model
from dpsynth_ml.sampling.generate import (
    LayoutSet,
    _generate,
    _image_generator,
    load_layouts,
    make_scheduler,
)
from dpsynth_ml.spec import MODEL_FORMAT_VERSION, Architecture
from PIL import Image

from .support import IMAGE_SIZE

SAMPLERS = ("ddpm", "ddim", "dpm_solver++")


def _draw(model_dir: Path, out: Path, *, sampler: str = "ddim", steps: int = 3, seed: int = 0,
          n: int = 2, classes: tuple[int, ...] = (1,), guidance_scale: float = 1.0,
          **kwargs: object) -> tuple[SampleResult, np.ndarray]:
    """Sample and return the result with the images, uint8 [classes * n, H, W]."""
    result = sample(model_dir, samples_per_class=n, sampler=sampler,  # type: ignore[arg-type]
                    steps=steps, guidance_scale=guidance_scale, seed=seed, out_dir=out,
                    classes=list(classes), **kwargs)  # type: ignore[arg-type]
    names = [f"digit_{c}" for c in classes]
    images = [np.array(Image.open(out / name / f"{i}.png")) for name in names for i in range(n)]
    return result, np.stack(images)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_sampler_writes_valid_images_reproducible_by_seed(
        pretrained: TrainingResult, tmp_path: Path, sampler: str) -> None:
    first, images = _draw(pretrained.model_dir, tmp_path / "a", sampler=sampler,
                          guidance_scale=2.0, classes=(0, 3))
    assert dict(first.counts) == {"digit 0": 2, "digit 3": 2} and first.seed == 0
    assert images.shape == (4, IMAGE_SIZE, IMAGE_SIZE) and images.dtype == np.uint8
    assert images.std() > 0  # not a constant image
    assert first.images_per_second > 0 and first.layouts == {}
    _, again = _draw(pretrained.model_dir, tmp_path / "b", sampler=sampler,
                     guidance_scale=2.0, classes=(0, 3))
    _, other_seed = _draw(pretrained.model_dir, tmp_path / "c", sampler=sampler, seed=1,
                          guidance_scale=2.0, classes=(0, 3))
    assert np.array_equal(images, again)
    assert not np.array_equal(images, other_seed)


def test_the_sampler_option_selects_the_diffusers_scheduler(pretrained: TrainingResult) -> None:
    bundle, _ = load_model(pretrained.model_dir)
    ddpm = make_scheduler(bundle, "ddpm", 5)
    ddim = make_scheduler(bundle, "ddim", 5)
    dpm = make_scheduler(bundle, "dpm_solver++", 5)
    assert type(ddpm) is DDPMScheduler and type(ddim) is DDIMScheduler
    assert isinstance(dpm, DPMSolverMultistepScheduler)
    assert dpm.config.algorithm_type == "dpmsolver++"
    # Built from the model's own noise schedule, with `steps` denoising steps.
    assert dpm.config.beta_schedule == bundle.scheduler.config.beta_schedule
    assert dpm.config.num_train_timesteps == bundle.scheduler.config.num_train_timesteps
    assert len(dpm.timesteps) == 5 and int(dpm.timesteps[0]) == 999
    with pytest.raises(InvalidSpecError):
        make_scheduler(bundle, "euler", 5)  # type: ignore[arg-type]


def test_samplers_give_different_images_from_the_same_noise(
        pretrained: TrainingResult, tmp_path: Path) -> None:
    drawn = {s: _draw(pretrained.model_dir, tmp_path / s, sampler=s)[1] for s in SAMPLERS}
    assert not np.array_equal(drawn["ddpm"], drawn["ddim"])
    assert not np.array_equal(drawn["dpm_solver++"], drawn["ddim"])


def test_dpm_solver_pp_at_few_steps_is_close_to_the_ode_solution(
        pretrained: TrainingResult, tmp_path: Path) -> None:
    """DDIM and DPM-Solver++ solve the same probability-flow ODE from the same initial
    noise (one generator per image). At 4 steps DPM-Solver++ (second order, from t = T)
    lands far closer to the 25-step solution than DDIM does (first order; its "leading"
    spacing also starts it at t = 750). Measured: mean |error| about 5 vs 26 grey levels."""
    _, reference = _draw(pretrained.model_dir, tmp_path / "ref", steps=25)
    _, ddim = _draw(pretrained.model_dir, tmp_path / "ddim", steps=4)
    _, dpm = _draw(pretrained.model_dir, tmp_path / "dpm", sampler="dpm_solver++", steps=4)

    def err(x: np.ndarray) -> float:
        return float(np.abs(x.astype(float) - reference.astype(float)).mean())

    assert err(dpm) < 0.5 * err(ddim)
    for steps in (1, 2):  # works down to a single step: non-constant images
        _, few = _draw(pretrained.model_dir, tmp_path / f"dpm{steps}", sampler="dpm_solver++",
                       steps=steps, n=1)
        assert few.std() > 0


def test_batch_size_changes_batching_not_the_images(pretrained: TrainingResult,
                                                    tmp_path: Path) -> None:
    calls: dict[int, list[tuple[int, int]]] = {1: [], 2: [], 64: []}
    drawn = {}
    for batch_size, progress in calls.items():
        result, drawn[batch_size] = _draw(
            pretrained.model_dir, tmp_path / str(batch_size), sampler="ddpm", n=3,
            classes=(5,), batch_size=batch_size,
            progress=lambda done, total, p=progress: p.append((done, total)))
        assert result.total == 3 and dict(result.counts) == {"digit 5": 3}
    assert calls[1] == [(1, 3), (2, 3), (3, 3)]
    assert calls[2] == [(2, 3), (3, 3)]
    assert calls[64] == [(3, 3)]
    # One generator per image: DDPM's noise does not depend on the batching.
    assert np.array_equal(drawn[1], drawn[2]) and np.array_equal(drawn[1], drawn[64])
    assert len({d.tobytes() for d in drawn[1]}) == 3  # ... and differs between images


def test_an_image_depends_on_seed_class_and_index_only(pretrained: TrainingResult,
                                                       tmp_path: Path) -> None:
    _, alone = _draw(pretrained.model_dir, tmp_path / "a", sampler="ddpm", classes=(4,))
    _, together = _draw(pretrained.model_dir, tmp_path / "b", sampler="ddpm", classes=(0, 4))
    assert np.array_equal(alone, together[2:])


def test_bad_sampling_arguments_are_refused(pretrained: TrainingResult, tmp_path: Path) -> None:
    for kwargs in ({"sampler": "euler"}, {"batch_size": 0}, {"steps": 0}):
        args: dict[str, object] = {"sampler": "ddim", "steps": 2, "batch_size": 4, **kwargs}
        with pytest.raises(InvalidSpecError):
            sample(pretrained.model_dir, samples_per_class=1, guidance_scale=1.0, seed=0,
                   out_dir=tmp_path, **args)  # type: ignore[arg-type]


# --- layout conditioning (DP-DocLDM) ----------------------------------------------------

LAYOUT_CLASSES = ("letter", "form", "memo")


def _layout_model(root: Path, architecture: Architecture | None = None) -> Path:
    """A fresh (untrained) layout-conditioned tiny model: sampling plumbing needs no
    training, and an untrained UNet still reacts to its layout input."""
    spec = PretrainTraining(preset="custom" if architecture else "tiny",
                        architecture=architecture, image_size=IMAGE_SIZE,
                        layout_conditioning=True, num_classes=len(LAYOUT_CLASSES), epochs=1)
    plan = plan_model(spec)
    torch.manual_seed(0)
    bundle = build_bundle(plan, num_classes=len(LAYOUT_CLASSES))
    info = ModelInfo(format_version=MODEL_FORMAT_VERSION, preset=spec.preset,
                     image_size=IMAGE_SIZE, channels=1, latent_channels=plan.latent_channels,
                     vae_scaling_factor=1.0, num_classes=len(LAYOUT_CLASSES),
                     class_names=LAYOUT_CLASSES, null_class=len(LAYOUT_CLASSES), rng="os",
                     training_kind="pretrain", steps=0)
    return save_model(bundle, info, root / "model")


@pytest.fixture(scope="module")
def layout_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _layout_model(tmp_path_factory.mktemp("layout-model"))


def _stripes(rows: list[int], size: int = 32) -> np.ndarray:
    """One mask with text lines (255) on the given rows of a size x size page."""
    mask = np.zeros((size, size, 1), dtype=np.uint8)
    for r in rows:
        mask[r:r + 2, 2:size - 2] = 255
    return mask


def _layout_set(**kwargs: object) -> LayoutSet:
    """8 distinct masks: 0-3 letters, 4 a form, 5-7 an invoice (a class the model lacks)."""
    masks = np.stack([_stripes(list(range(2 + k, 30, 4 + k))) for k in range(8)])
    labels = np.array([0, 0, 0, 0, 1, 2, 2, 2])
    return LayoutSet(masks=masks, labels=labels, class_names=("letter", "form", "invoice"),
                     **kwargs)  # type: ignore[arg-type]


def _layout_draw(model_dir: Path, out: Path, layouts: LayoutSet | None, *, n: int = 3,
                 seed: int = 0, classes: tuple[int, ...] = (0, 1, 2),
                 **kwargs: object) -> tuple[SampleResult, np.ndarray]:
    result = sample(model_dir, samples_per_class=n, sampler="ddim", steps=2,
                    guidance_scale=2.0, seed=seed, out_dir=out, layouts=layouts,
                    classes=list(classes), **kwargs)  # type: ignore[arg-type]
    images = [np.array(Image.open(out / LAYOUT_CLASSES[c] / f"{i}.png"))
              for c in classes for i in range(n)]
    return result, np.stack(images)


def test_a_layout_model_needs_layouts_and_a_plain_model_refuses_them(
        layout_model: Path, pretrained: TrainingResult, tmp_path: Path) -> None:
    assert read_model_info(layout_model).extra["layout_channels"] == 4
    with pytest.raises(InvalidSpecError, match="layout"):
        _layout_draw(layout_model, tmp_path / "a", None)
    with pytest.raises(InvalidSpecError, match="layout"):
        sample(pretrained.model_dir, samples_per_class=1, sampler="ddim", steps=1,
               guidance_scale=1.0, seed=0, out_dir=tmp_path / "b", layouts=_layout_set())
    assert not list(tmp_path.rglob("*.png"))


def test_layouts_are_drawn_per_class_with_the_seed(layout_model: Path, tmp_path: Path) -> None:
    result, _ = _layout_draw(layout_model, tmp_path / "a", _layout_set(), n=3)
    used = dict(result.layouts)
    assert set(used) == set(LAYOUT_CLASSES) and all(len(v) == 3 for v in used.values())
    assert set(used["letter"]) <= {0, 1, 2, 3} and len(set(used["letter"])) == 3
    assert used["form"] == (4, 4, 4)  # one form mask: drawn with replacement
    assert set(used["memo"]) <= set(range(8))  # no memo masks: drawn from all of them
    again, _ = _layout_draw(layout_model, tmp_path / "b", _layout_set(), n=3)
    assert dict(again.layouts) == used
    other = [dict(_layout_draw(layout_model, tmp_path / f"s{s}", _layout_set(), n=3,
                               seed=s, classes=(0,))[0].layouts)["letter"]
             for s in (1, 2, 3)]
    assert any(o != used["letter"] for o in other)
    mixed, _ = _layout_draw(layout_model, tmp_path / "c", _layout_set(per_class=False), n=3,
                            classes=(0,))
    assert dict(mixed.layouts)["letter"] != used["letter"]


def test_each_image_is_conditioned_on_its_own_mask(layout_model: Path, tmp_path: Path) -> None:
    base = _layout_set()
    result, images = _layout_draw(layout_model, tmp_path / "a", base, n=3, batch_size=2)
    # Change one letter mask that was used, keep the others: exactly the images drawn
    # with that mask change.
    letter = dict(result.layouts)["letter"]
    changed = letter[0]
    masks = base.masks.copy()
    masks[changed] = 255 - masks[changed]
    altered = LayoutSet(masks=masks, labels=base.labels, class_names=base.class_names)
    _, images2 = _layout_draw(layout_model, tmp_path / "b", altered, n=3, batch_size=2)
    differs = [not np.array_equal(a, b) for a, b in zip(images, images2, strict=True)]
    used_flat = [i for name in LAYOUT_CLASSES for i in dict(result.layouts)[name]]
    assert differs == [i == changed for i in used_flat]
    assert differs[0]


def test_load_layouts_reads_the_masks_of_a_dataset_file(tmp_path: Path) -> None:
    layouts = _layout_set()
    path = tmp_path / "docs.npz"
    np.savez(path, images=layouts.masks.repeat(3, axis=-1), labels=layouts.labels,
             masks=layouts.masks, class_names=np.array(layouts.class_names))
    loaded = load_layouts(path, per_class=False)
    assert np.array_equal(loaded.masks, layouts.masks) and not loaded.per_class
    assert loaded.class_names == layouts.class_names
    np.savez(path, images=layouts.masks, labels=layouts.labels,
             class_names=np.array(layouts.class_names))
    with pytest.raises(InvalidSpecError, match="no layout masks"):
        load_layouts(path)


# --- per-label bundles (DP-DocLDM): each class from its own denoiser -------------------

def _perturbed_copy(model_dir: Path, dest: Path) -> Path:
    """The model with another UNet (weights moved), same VAE and scheduler."""
    shutil.copytree(model_dir, dest)
    bundle, _ = load_model(dest)
    with torch.no_grad():
        for p in bundle.unet.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(9)))
    bundle.unet.save_pretrained(dest / "unet", safe_serialization=True)
    return dest


@pytest.fixture(scope="module")
def two_denoisers(pretrained: TrainingResult,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("per-label")
    return pretrained.model_dir, _perturbed_copy(pretrained.model_dir, root / "b")


def _bundle(root: Path, denoisers: dict[str, Path]) -> Path:
    from dpsynth_ml.models.model_io import save_per_label_model

    return save_per_label_model(denoisers, root)


def _direct(model_dir: Path, label: int | None, cls: int, n: int = 2) -> np.ndarray:
    """Images of class index ``cls`` computed directly from one model's denoiser with
    ``label`` (None = the null class), with the generators ``sample`` gives that class."""
    bundle, info = load_model(model_dir)
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
    images = _generate(bundle, info, denoiser, info.null_class if label is None else label,
                       n, sampler="ddim", steps=3, guidance_scale=1.0, layout=None,
                       generators=[_image_generator(0, cls, i) for i in range(n)])
    return images[..., 0]


def test_a_per_label_bundle_draws_each_class_from_its_own_denoiser(
        two_denoisers: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_denoisers
    ab = _bundle(tmp_path / "ab", {"digit 0": a, "digit 3": b})
    result, drawn = _draw(ab, tmp_path / "s", classes=(0, 3))
    assert dict(result.counts) == {"digit 0": 2, "digit 3": 2}
    assert np.array_equal(drawn[:2], _direct(a, None, 0))
    assert np.array_equal(drawn[2:], _direct(b, None, 3))
    assert not np.array_equal(drawn[:2], _direct(b, None, 0))  # the denoisers do differ
    # By default only the classes the bundle has denoisers for are drawn.
    default = sample(ab, samples_per_class=1, sampler="ddim", steps=1, guidance_scale=1.0,
                     seed=0, out_dir=tmp_path / "default")
    assert dict(default.counts) == {"digit 0": 1, "digit 3": 1}
    with pytest.raises(InvalidSpecError, match="denoiser"):
        sample(ab, samples_per_class=1, sampler="ddim", steps=1, guidance_scale=1.0, seed=0,
               out_dir=tmp_path / "missing", classes=[5])


def test_per_label_denoisers_are_sampled_unconditionally_without_guidance(
        two_denoisers: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_denoisers
    ab = _bundle(tmp_path / "ab", {"digit 0": a, "digit 3": b})
    _, plain = _draw(ab, tmp_path / "w1", classes=(3,))
    _, guided = _draw(ab, tmp_path / "w5", classes=(3,), guidance_scale=5.0)
    assert np.array_equal(plain, guided)  # guidance does not apply
    assert np.array_equal(plain, _direct(b, None, 3))  # the null-label path ...
    assert not np.array_equal(plain, _direct(b, 3, 3))  # ... not the class token's
