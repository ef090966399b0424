"""DP-FETA central images: the release's sensitivity, public normaliser, charge-before-noise
order and noise scale, unit-level subsampling, and finetunes that warm up on the release
(pixel and latent), write it with the model and never charge it again on resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dpsynth_ml import PretrainTraining, TrainingResult, read_model_info, train
from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.spec import CentralImages, InvalidSpecError
from dpsynth_ml.warmup import class_sums, release_central_images
from dpsynth_ml.warmup.store import PREVIEW_FILE, RELEASE_FILE
from dpsynth_shared.central_images import central_image_bound
from PIL import Image

from .dp_support import one_thread
from .support import IMAGE_SIZE, RecordingHooks, finetune_spec, model_state, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]


class Events:
    """An order log shared by the fakes below."""

    def __init__(self) -> None:
        self.log: list[str] = []


class ZeroNormal:
    """A deterministic normal source: zeros (tests only; logs each draw)."""

    def __init__(self, events: Events | None = None) -> None:
        self.events = events if events is not None else Events()
        self.calls = 0

    def normal(self, loc: float = 0.0, scale: float = 1.0,
               size: int | None = None) -> np.ndarray:
        self.calls += 1
        self.events.log.append("noise")
        return np.zeros(1 if size is None else size)


class OrderHooks(RecordingHooks):
    def __init__(self, events: Events, refuse: bool = False) -> None:
        super().__init__(refuse_release=refuse)
        self.events = events

    def charge_release(self, release: CentralImages) -> None:
        self.events.log.append("charge")
        super().charge_release(release)


def _dataset(n: int = 30, classes: int = 3, size: int = 8, channels: int = 1,
             subjects: np.ndarray | None = None, seed: int = 0) -> ImageDataset:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8)
    labels = np.arange(n, dtype=np.int64) % classes
    return ImageDataset(images=images, labels=labels,
                        class_names=tuple(f"c{i}" for i in range(classes)),
                        subjects=subjects,
                        num_subjects=int(subjects.max()) + 1 if subjects is not None else None)


def _spec(dataset: ImageDataset, sizes: dict[str, int] | None = None, **kw: object,
          ) -> CentralImages:
    size, channels = dataset.images.shape[1], dataset.images.shape[3]
    downsample = int(kw.pop("downsample", 2))  # type: ignore[call-overload]
    fields: dict[str, object] = dict(
        noise_std=1.0, bound=central_image_bound(size, channels, downsample),
        class_sizes=sizes or {n: 10 for n in dataset.class_names}, downsample=downsample)
    fields.update(kw)
    return CentralImages(**fields)  # type: ignore[arg-type]


def _sums(dataset: ImageDataset, mask: np.ndarray | None = None, *, bound: float,
          downsample: int = 2) -> np.ndarray:
    return class_sums(dataset.images, dataset.labels, dataset.subjects, downsample=downsample,
                      bound=bound, num_classes=len(dataset.class_names), sample_mask=mask)


# (a) sensitivity ---------------------------------------------------------------------------

def test_a_subject_with_ten_images_in_two_classes_moves_the_sums_by_at_most_the_bound() -> None:
    subjects = np.repeat(np.arange(6), 5)  # 30 images, 6 subjects x 5
    subjects[:10] = 0  # subject 0: ten images, labels 0,1,2,0,... -> three classes
    subjects[10:] = np.repeat(np.arange(1, 5), 5)
    data = _dataset(30, subjects=subjects)
    data.images[:10] = 255  # all bright: its unclipped contribution is far above the bound
    bound = central_image_bound(8, 1, 2)
    without = np.ones(5, dtype=bool)
    without[0] = False
    diff = _sums(data, bound=bound) - _sums(data, without, bound=bound)
    assert np.linalg.norm(diff) == pytest.approx(bound, rel=1e-9)  # clipped exactly once
    assert np.count_nonzero(np.abs(diff).reshape(3, -1).sum(axis=1)) == 3

    # a subject spanning exactly two classes, of mixed images, with a smaller bound
    two = _dataset(20, classes=2, subjects=np.array([0] * 10 + list(range(1, 11))), seed=3)
    small = 0.3 * bound
    keep = np.ones(11, dtype=bool)
    keep[0] = False
    moved = _sums(two, bound=small) - _sums(two, keep, bound=small)
    assert np.linalg.norm(moved) <= small * (1 + 1e-9)
    assert np.abs(moved[0]).sum() > 0 and np.abs(moved[1]).sum() > 0


def test_subject_sums_are_the_clipped_whole_contributions() -> None:
    subjects = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    data = _dataset(10, classes=2, subjects=subjects, seed=5)
    bound = 2.0
    got = _sums(data, bound=bound)
    pooled = data.images.astype(np.float64).reshape(10, 4, 2, 4, 2, 1).mean(axis=(2, 4)) / 255
    centred = pooled - 0.5
    want = np.zeros((2, 4, 4, 1))
    for s in range(4):
        contrib = np.zeros((2, 4, 4, 1))
        for i in np.flatnonzero(subjects == s):
            contrib[data.labels[i]] += centred[i]
        contrib *= min(1.0, bound / np.linalg.norm(contrib))
        want += contrib
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_one_record_moves_the_sums_by_at_most_the_bound() -> None:
    data = _dataset(12)
    data.images[0] = 255
    bound = central_image_bound(8, 1, 2)
    mask = np.ones(12, dtype=bool)
    mask[0] = False
    diff = _sums(data, bound=bound) - _sums(data, mask, bound=bound)
    assert np.linalg.norm(diff) <= bound * (1 + 1e-9)
    assert np.abs(diff).max() <= 0.5 + 1e-12


# (b) public normaliser ---------------------------------------------------------------------

def test_the_mean_divides_by_the_public_size_never_the_true_count() -> None:
    data = _dataset(30)  # 10 per class
    true_sums = _sums(data, bound=central_image_bound(8, 1, 2))
    exact = release_central_images(data, _spec(data), class_index=[0, 1, 2],
                                   normal_source=ZeroNormal(), hooks=RecordingHooks())
    np.testing.assert_allclose(exact.means[0], true_sums / 10.0, atol=1e-12)
    huge = {n: 10**9 for n in data.class_names}
    flat = release_central_images(data, _spec(data, huge), class_index=[0, 1, 2],
                                  normal_source=ZeroNormal(), hooks=RecordingHooks())
    np.testing.assert_allclose(flat.means[0], true_sums / 1e9, atol=1e-12)
    assert np.abs(flat.images - 0.5).max() < 1e-5  # a huge N̂ gives grey, whatever the data
    assert exact.images.shape == (3, 8, 8, 1) and exact.images.dtype == np.float32
    assert 0.0 <= exact.images.min() and exact.images.max() <= 1.0
    np.testing.assert_array_equal(exact.labels, [0, 1, 2])


def test_a_class_without_a_public_size_is_refused_before_any_charge() -> None:
    data = _dataset(30)
    hooks = RecordingHooks()
    with pytest.raises(InvalidSpecError, match="misses classes"):
        release_central_images(data, _spec(data, {"c0": 5, "c1": 5}), class_index=[0, 1, 2],
                               normal_source=ZeroNormal(), hooks=hooks)
    assert hooks.releases == []


# (c) charge before noise -------------------------------------------------------------------

@pytest.mark.parametrize("sample_rate", [None, 0.5])
def test_the_release_is_charged_once_before_the_first_draw(sample_rate: float | None) -> None:
    events = Events()
    data = _dataset(30)
    queries = 1 if sample_rate is None else 3
    spec = _spec(data, sample_rate=sample_rate, queries=queries)

    def uniforms(n: int) -> np.ndarray:
        events.log.append("sample")
        return np.full(n, 0.25)

    hooks = OrderHooks(events)
    release_central_images(data, spec, class_index=[0, 1, 2], normal_source=ZeroNormal(events),
                           hooks=hooks, uniform_source=uniforms)
    assert hooks.releases == [spec]
    assert events.log[0] == "charge" and events.log.count("charge") == 1
    assert events.log.count("noise") == queries


def test_a_refused_charge_releases_nothing_and_draws_nothing() -> None:
    events = Events()
    data = _dataset(30)
    noise = ZeroNormal(events)
    sampled: list[int] = []
    with pytest.raises(RuntimeError, match="refused"):
        release_central_images(data, _spec(data, sample_rate=0.5, queries=2),
                               class_index=[0, 1, 2], normal_source=noise,
                               hooks=OrderHooks(events, refuse=True),
                               uniform_source=lambda n: sampled.append(n) or np.zeros(n))
    assert events.log == ["charge"] and noise.calls == 0 and sampled == []


# (d) noise scale ---------------------------------------------------------------------------

def test_the_noise_has_std_sigma_over_the_public_size() -> None:
    data = _dataset(60, classes=3, size=32)
    sizes = {"c0": 4, "c1": 20, "c2": 100}
    sigma = 3.0
    spec = _spec(data, sizes, noise_std=sigma, downsample=1)
    noiseless = release_central_images(data, spec, class_index=[0, 1, 2],
                                       normal_source=ZeroNormal(), hooks=RecordingHooks())
    noisy = release_central_images(data, spec, class_index=[0, 1, 2],
                                   normal_source=np.random.default_rng(7),
                                   hooks=RecordingHooks())
    diff = (noisy.means - noiseless.means)[0].reshape(3, -1)  # 1024 coordinates per class
    for c, name in enumerate(data.class_names):
        assert diff[c].std() == pytest.approx(sigma / sizes[name], rel=0.1)
        assert abs(diff[c].mean()) < 5 * sigma / sizes[name] / 32


# (e) subsampled queries --------------------------------------------------------------------

def test_subsampled_queries_sample_subjects_and_give_queries_times_classes_images() -> None:
    subjects = np.repeat(np.arange(10), 3)  # 30 images, 10 subjects
    data = _dataset(30, subjects=subjects)
    requested: list[int] = []

    def only_subject_zero(n: int) -> np.ndarray:
        requested.append(n)
        u = np.ones(n)
        u[0] = 0.0  # subject 0 in, every other subject out
        return u

    q = 0.25
    spec = _spec(data, sample_rate=q, queries=4)
    release = release_central_images(data, spec, class_index=[2, 0, 1],
                                     normal_source=ZeroNormal(), hooks=RecordingHooks(),
                                     uniform_source=only_subject_zero)
    assert requested == [10] * 4  # one uniform per SUBJECT per query
    assert release.images.shape == (12, 8, 8, 1)
    np.testing.assert_array_equal(release.labels, [2, 0, 1] * 4)
    mask = np.zeros(10, dtype=bool)
    mask[0] = True
    alone = _sums(data, mask, bound=spec.bound)  # all three images of subject 0, no other
    for k in range(4):
        np.testing.assert_allclose(release.means[k] * 10 * q, alone, atol=1e-12)


# (f), (g) finetunes ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pixel_base(tmp_path_factory: pytest.TempPathFactory, digits_path: Path) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1, batch_size=25,
                            learning_rate=1e-3, seed=0, space="pixel")
    return train(spec, dataset_path=digits_path, out_dir=tmp_path_factory.mktemp("pixbase"))


def _central(digits_path: Path, **kw: object) -> CentralImages:
    data = load_dataset(digits_path)
    sizes = {n: int((data.labels == i).sum()) + 1 for i, n in enumerate(data.class_names)}
    fields: dict[str, object] = dict(noise_std=2.0, bound=central_image_bound(IMAGE_SIZE, 1, 2),
                                     class_sizes=sizes, warmup_steps=3, warmup_batch_size=8)
    fields.update(kw)
    return CentralImages(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("space", ["pixel", "latent"])
def test_a_finetune_warms_up_on_the_central_images(
        space: str, tmp_path: Path, digits_path: Path, request: pytest.FixtureRequest) -> None:
    base: TrainingResult = request.getfixturevalue(
        "pixel_base" if space == "pixel" else "pretrained")
    central = _central(digits_path, sample_rate=0.5, queries=2)
    spec = finetune_spec(dp_steps=4, checkpoint_every=2, central_images=central)
    hooks = RecordingHooks()
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
                   base_model_dir=base.model_dir, _test_generator=seeded())
    assert result.steps_completed == 4 and hooks.releases == [central]
    model = result.model_dir
    with np.load(model / RELEASE_FILE, allow_pickle=False) as npz:
        assert npz["images"].shape == (20, IMAGE_SIZE, IMAGE_SIZE, 1)
        np.testing.assert_array_equal(npz["labels"], list(range(10)) * 2)
        assert json.loads(str(npz["settings"]))["noise_std"] == 2.0
    with Image.open(model / PREVIEW_FILE) as grid:  # one row per class, one column per query
        assert grid.size == (2 * IMAGE_SIZE, 10 * IMAGE_SIZE)
    record = read_model_info(model).extra["central_images"]
    assert record == {"noise_std": 2.0, "bound": central.bound, "downsample": 2, "queries": 2,
                      "sample_rate": 0.5, "warmup_steps": 3, "warmup_batch_size": 8,
                      "warmup_learning_rate": central.warmup_learning_rate,
                      "warmup_ema_decay": 0.995, "augment": True,
                      "n_released": 20}
    for step in (2, 4):
        assert (tmp_path / "checkpoints" / f"step-{step:07d}" / RELEASE_FILE).is_file()
    # the warm-up trained the whole UNet, not only the DP-trained attention
    before, after = model_state(base.model_dir), model_state(model)
    conv = [k for k in before if k.startswith("unet.conv_in")]
    assert conv and all(not np.array_equal(before[k].numpy(), after[k].numpy()) for k in conv)
    vae = [k for k in before if k.startswith("vae.")]  # the VAE stays frozen
    assert all(np.array_equal(before[k].numpy(), after[k].numpy()) for k in vae)


def test_a_resume_reuses_the_release_and_never_charges_again(
        tmp_path: Path, digits_path: Path, pixel_base: TrainingResult) -> None:
    spec = finetune_spec(dp_steps=4, checkpoint_every=2, central_images=_central(digits_path))
    first = RecordingHooks(budget=2)
    stopped = train(spec, dataset_path=digits_path, out_dir=tmp_path / "a", hooks=first,
                    base_model_dir=pixel_base.model_dir, _test_generator=seeded(1))
    assert stopped.steps_completed == 2 and len(first.releases) == 1
    ckpt = tmp_path / "a" / "checkpoints" / "step-0000002"
    again = RecordingHooks()
    resumed = train(spec, dataset_path=digits_path, out_dir=tmp_path / "b", hooks=again,
                    base_model_dir=pixel_base.model_dir, resume_from=ckpt,
                    _test_generator=seeded(2))
    assert resumed.steps_completed == 4 and again.releases == []
    with np.load(ckpt / RELEASE_FILE) as old, np.load(resumed.model_dir / RELEASE_FILE) as new:
        np.testing.assert_array_equal(old["images"], new["images"])
    assert read_model_info(resumed.model_dir).extra["central_images"]["n_released"] == 10

    # a fresh attempt in an out_dir that already holds the release reuses it, uncharged
    retry = RecordingHooks()
    train(spec, dataset_path=digits_path, out_dir=tmp_path / "a", hooks=retry,
          base_model_dir=pixel_base.model_dir, _test_generator=seeded(3))
    assert retry.releases == []


def test_a_refused_charge_stops_the_finetune_before_anything_is_released(
        tmp_path: Path, digits_path: Path, pixel_base: TrainingResult) -> None:
    spec = finetune_spec(dp_steps=2, central_images=_central(digits_path))
    hooks = RecordingHooks(refuse_release=True)
    with pytest.raises(RuntimeError, match="refused"):
        train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
              base_model_dir=pixel_base.model_dir, _test_generator=seeded())
    assert not (tmp_path / RELEASE_FILE).exists() and hooks.acquired == []


def test_on_two_ranks_rank_zero_releases_once_and_every_rank_starts_from_its_warm_up(
        tmp_path: Path, digits_path: Path, pixel_base: TrainingResult) -> None:
    """Rank 0 (this process, with the hooks) releases and warms up; the spawned rank gets
    its weights (else the collective in-sync check of the first checkpoint would fail)."""
    import torch
    from dpsynth_ml.parallel.ranks import train_on_ranks

    hooks = RecordingHooks()
    spec = finetune_spec(dp_steps=2, checkpoint_every=2, dp_sample_rate=0.1,
                         dp_expected_batch_size=10, central_images=_central(digits_path))
    result = train_on_ranks([torch.device("cpu")] * 2, spec, dataset_path=digits_path,
                            out_dir=tmp_path, hooks=hooks, base_model_dir=pixel_base.model_dir,
                            timeout_s=120, _test_seed=10)
    assert result.steps_completed == 2 and len(hooks.releases) == 1
    assert (result.model_dir / RELEASE_FILE).is_file()
    assert (tmp_path / "checkpoints" / "step-0000002" / RELEASE_FILE).is_file()
