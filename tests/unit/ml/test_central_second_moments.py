"""Central images with second moments: each unit's outer products are bounded by bound² over
all its classes (so the joint release moves by at most √2·bound), the noise is noise_std on
each scaled upper-triangle coordinate, the post-processed components reproduce the class
covariance, and a finetune warms up on draws from the released Gaussians and resumes from
them without a new charge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dpsynth_ml import PretrainTraining, TrainingResult, train
from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.spec import CentralImages, InvalidSpecError
from dpsynth_ml.warmup import class_sums, release_central_images
from dpsynth_ml.warmup.moments import (
    class_second_moments,
    noisy_symmetric,
    released_components,
)
from dpsynth_ml.warmup.release import sample_released
from dpsynth_ml.warmup.store import RELEASE_FILE, load_release
from dpsynth_shared.central_images import (
    central_image_bound,
    central_image_sensitivity,
    central_image_unit_norm,
)

from .dp_support import one_thread
from .support import IMAGE_SIZE, RecordingHooks, finetune_spec, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]


class CountingZeros:
    """Zero noise; records the size of every draw (tests only)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def normal(self, loc: float = 0.0, scale: float = 1.0,
               size: int | None = None) -> np.ndarray:
        self.sizes.append(1 if size is None else size)
        return np.zeros(1 if size is None else size)


def _dataset(n: int = 30, classes: int = 3, size: int = 8,
             subjects: np.ndarray | None = None, seed: int = 0) -> ImageDataset:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8)
    return ImageDataset(images=images, labels=np.arange(n, dtype=np.int64) % classes,
                        class_names=tuple(f"c{i}" for i in range(classes)), subjects=subjects,
                        num_subjects=int(subjects.max()) + 1 if subjects is not None else None)


def _moments(data: ImageDataset, mask: np.ndarray | None = None, *, bound: float) -> np.ndarray:
    return class_second_moments(data.images, data.labels, data.subjects, downsample=2,
                                bound=bound, num_classes=len(data.class_names),
                                sample_mask=mask)


def _triu(moments: np.ndarray) -> np.ndarray:
    """The released coordinates: the upper triangle, off-diagonal × √2."""
    iu = np.triu_indices(moments.shape[1])
    return moments[:, iu[0], iu[1]] * np.where(iu[0] == iu[1], 1.0, np.sqrt(2.0))


def test_the_sensitivity_grows_by_sqrt_two_under_either_relation() -> None:
    bound = central_image_bound(28, 1, 2)
    assert central_image_unit_norm(bound) == bound
    assert central_image_unit_norm(bound, True) == pytest.approx(np.sqrt(2) * bound)
    for relation, factor in (("add_remove", 1.0), ("replace_one", 2.0)):
        plain = central_image_sensitivity(bound, relation)
        assert plain == factor * bound
        assert central_image_sensitivity(bound, relation, second_moments=True) == \
            pytest.approx(np.sqrt(2) * plain)


def test_record_level_moments_are_the_exact_outer_products() -> None:
    data = _dataset(12, classes=2, seed=4)
    bound = central_image_bound(8, 1, 2)  # the largest norm: no record is clipped
    pooled = data.images.astype(np.float64).reshape(12, 4, 2, 4, 2).mean(axis=(2, 4)) / 255
    u = (pooled - 0.5).reshape(12, 16)
    got = _moments(data, bound=bound)
    for c in range(2):
        np.testing.assert_allclose(got[c], u[data.labels == c].T @ u[data.labels == c],
                                   atol=1e-12)


def test_one_record_moves_the_joint_release_by_at_most_sqrt_two_bound() -> None:
    data = _dataset(20, classes=2, seed=1)
    data.images[0] = 255  # the largest contribution: norm = bound exactly
    bound = central_image_bound(8, 1, 2)
    keep = np.ones(20, dtype=bool)
    keep[0] = False
    sums = class_sums(data.images, data.labels, None, downsample=2, bound=bound,
                      num_classes=2)
    sums_without = class_sums(data.images, data.labels, None, downsample=2, bound=bound,
                              num_classes=2, sample_mask=keep)
    moved = _triu(_moments(data, bound=bound) - _moments(data, keep, bound=bound)) / bound
    assert np.linalg.norm(moved) <= bound * (1 + 1e-9)
    joint = np.sqrt(np.sum((sums - sums_without) ** 2) + np.sum(moved ** 2))
    assert joint == pytest.approx(central_image_unit_norm(bound, True), rel=1e-6)


def test_a_subject_of_ten_bright_images_in_three_classes_is_bounded_jointly() -> None:
    subjects = np.concatenate([np.zeros(10, dtype=np.int64), np.arange(1, 21)])
    data = _dataset(30, subjects=subjects, seed=2)
    data.images[:10] = 255  # ten images of norm = bound each: unscaled, 10·bound²
    bound = central_image_bound(8, 1, 2)
    keep = np.ones(21, dtype=bool)
    keep[0] = False
    moved = _moments(data, bound=bound) - _moments(data, keep, bound=bound)
    # scaled by bound² / (10·bound²): 4, 3 and 3 images per class, each u·uᵀ of norm bound²
    frobenius = np.sqrt(np.sum(moved ** 2))
    assert frobenius == pytest.approx(bound ** 2 * np.sqrt(4**2 + 3**2 + 3**2) / 10, rel=1e-9)
    assert frobenius <= bound ** 2
    assert np.count_nonzero(np.abs(moved).reshape(3, -1).sum(axis=1)) == 3
    assert np.linalg.norm(_triu(moved)) / bound == pytest.approx(frobenius / bound, rel=1e-9)

    # all ten in one class: the bound is reached exactly
    one_class = _dataset(30, subjects=subjects, seed=2)
    one_class.images[:10] = 255
    one_class.labels[:10] = 1
    moved = _moments(one_class, bound=bound) - _moments(one_class, keep, bound=bound)
    assert np.sqrt(np.sum(moved ** 2)) == pytest.approx(bound ** 2, rel=1e-9)


def test_the_noise_is_noise_std_on_each_released_coordinate_after_the_charge() -> None:
    data = _dataset(40, classes=2, size=16)
    sizes = {"c0": 20, "c1": 20}
    bound = central_image_bound(16, 1, 2)
    spec = CentralImages(noise_std=4.0, bound=bound, class_sizes=sizes, second_moments=True,
                         components=64)
    zeros = CountingZeros()
    exact = release_central_images(data, spec, class_index=[0, 1], normal_source=zeros,
                                   hooks=RecordingHooks())
    assert zeros.sizes == [2 * 64, 2 * 64 * 65 // 2]  # the sums, then each class's triangle
    # the DP output itself: noise_std on each released coordinate (÷ √2 off the diagonal
    # once mapped back to the matrix), symmetric
    out = noisy_symmetric(np.zeros((2, 64, 64)), bound, 4.0, np.random.default_rng(3))
    np.testing.assert_array_equal(out, out.transpose(0, 2, 1))
    diag = np.concatenate([np.diag(m) for m in out])
    off = np.concatenate([m[np.triu_indices(64, 1)] for m in out])
    assert diag.std() == pytest.approx(4.0, rel=0.1)
    assert off.std() == pytest.approx(4.0 / np.sqrt(2.0), rel=0.03)
    assert exact.components is not None


def test_the_components_reproduce_the_class_covariance() -> None:
    data = _dataset(60, classes=2, size=8, seed=9)
    bound = central_image_bound(8, 1, 2)
    true = {name: int((data.labels == i).sum()) for i, name in enumerate(data.class_names)}
    spec = CentralImages(noise_std=1.0, bound=bound, class_sizes=true, second_moments=True,
                         components=16)
    release = release_central_images(data, spec, class_index=[0, 1],
                                      normal_source=CountingZeros(), hooks=RecordingHooks())
    pooled = data.images.astype(np.float64).reshape(60, 4, 2, 4, 2).mean(axis=(2, 4)) / 255
    u = (pooled - 0.5).reshape(60, 16)
    assert release.components is not None
    assert release.components.shape == (2, 16, 4, 4, 1)
    for c in range(2):
        xc = u[data.labels == c]
        want = np.cov(xc.T, bias=True)
        comps = release.components[c].reshape(16, 16).astype(np.float64)
        np.testing.assert_allclose(comps.T @ comps, want, atol=1e-5)
    # a negative eigenvalue (noise can make one) gives a zero direction, not a NaN
    flipped = released_components(-np.eye(16)[None] * 3, np.zeros((1, 16)), bound=1.0,
                                  normaliser=np.ones(1), components=4)
    assert np.all(flipped == 0)


def test_draws_from_the_released_gaussian_vary_and_stay_in_range() -> None:
    data = _dataset(60, classes=2, size=8, seed=9)
    bound = central_image_bound(8, 1, 2)
    spec = CentralImages(noise_std=1e-3, bound=bound, class_sizes={"c0": 30, "c1": 30},
                         second_moments=True, components=8)
    release = release_central_images(data, spec, class_index=[0, 1],
                                     normal_source=np.random.default_rng(0),
                                     hooks=RecordingHooks())
    import torch

    draws = sample_released(release, torch.tensor([0, 0, 0, 1]), seeded(), image_size=8)
    assert draws.shape == (4, 1, 8, 8)
    assert float(draws.min()) >= 0.0 and float(draws.max()) <= 1.0
    assert not torch.allclose(draws[0], draws[1])  # fresh draws, not the mean repeated
    plain = CentralImages(noise_std=1e-3, bound=bound, class_sizes={"c0": 30, "c1": 30})
    repeated = release_central_images(data, plain, class_index=[0, 1],
                                      normal_source=np.random.default_rng(0),
                                      hooks=RecordingHooks())
    same = sample_released(repeated, torch.tensor([0, 0]), seeded(), image_size=8)
    assert torch.equal(same[0], same[1])


def test_components_must_be_positive() -> None:
    with pytest.raises(InvalidSpecError, match="components"):
        CentralImages(noise_std=1.0, bound=1.0, class_sizes={"a": 1}, second_moments=True,
                      components=0)


@pytest.fixture(scope="module")
def pixel_base(tmp_path_factory: pytest.TempPathFactory, digits_path: Path) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1, batch_size=25,
                            learning_rate=1e-3, seed=0, space="pixel")
    return train(spec, dataset_path=digits_path, out_dir=tmp_path_factory.mktemp("pixbase2"))


def test_a_finetune_warms_up_on_released_gaussians_and_resumes_without_a_charge(
        tmp_path: Path, digits_path: Path, pixel_base: TrainingResult) -> None:
    data = load_dataset(digits_path)
    sizes = {n: int((data.labels == i).sum()) + 1 for i, n in enumerate(data.class_names)}
    central = CentralImages(noise_std=2.0, bound=central_image_bound(IMAGE_SIZE, 1, 2),
                            class_sizes=sizes, warmup_steps=3, warmup_batch_size=8,
                            second_moments=True, components=4)
    spec = finetune_spec(dp_steps=4, checkpoint_every=2, central_images=central)
    first = RecordingHooks(budget=2)
    stopped = train(spec, dataset_path=digits_path, out_dir=tmp_path / "a", hooks=first,
                    base_model_dir=pixel_base.model_dir, _test_generator=seeded(1))
    assert stopped.steps_completed == 2 and first.releases == [central]
    side = IMAGE_SIZE // 2
    with np.load(tmp_path / "a" / RELEASE_FILE, allow_pickle=False) as npz:
        assert npz["components"].shape == (10, 4, side, side, 1)
        settings = json.loads(str(npz["settings"]))
        assert settings["second_moments"] is True and settings["components"] == 4
    checkpoint = tmp_path / "a" / "checkpoints" / "step-0000002"
    saved = load_release(checkpoint / RELEASE_FILE, central)
    assert saved.components is not None
    again = RecordingHooks()
    resumed = train(spec, dataset_path=digits_path, out_dir=tmp_path / "b", hooks=again,
                    base_model_dir=pixel_base.model_dir, resume_from=checkpoint,
                    _test_generator=seeded(2))
    assert resumed.steps_completed == 4 and again.releases == []
    with np.load(resumed.model_dir / RELEASE_FILE) as npz:
        np.testing.assert_array_equal(npz["components"], saved.components)


def test_the_warm_up_average_moves_by_one_minus_decay() -> None:
    import torch
    from dpsynth_ml.warmup.train import _ema_update

    params = [torch.nn.Parameter(torch.full((3,), 2.0))]
    ema = [torch.zeros(3)]
    _ema_update(ema, params, 0.75)
    torch.testing.assert_close(ema[0], torch.full((3,), 0.5))
    with pytest.raises(InvalidSpecError, match="warmup_ema_decay"):
        CentralImages(noise_std=1.0, bound=1.0, class_sizes={"a": 1}, warmup_ema_decay=1.0)
    assert CentralImages(noise_std=1.0, bound=1.0, class_sizes={"a": 1},
                         warmup_ema_decay=None).warmup_ema_decay is None
