"""Every logical step costs the same whatever the data (issue 13, item 5; dp.padding).

The deterministic core: every step processes the same number of rows, a function of public
quantities (N̂, q, T, ε, δ) only, for any true size, for a per-label class without records
and for subjects. The timing tests compare per-step wall times of runs that differ only in
their true size, with the steps INTERLEAVED (so both see the same machine load) and a
tolerant statistic (ratio of medians), because the machine running them is shared.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dpsynth_ml import (
    DpSpec,
    FinetuneTraining,
    PerLabel,
    RecordLevel,
    TrainingResult,
    train,
)
from dpsynth_ml.data import load_dataset
from dpsynth_ml.dp.padding import (
    FixedBatch,
    fixed_batch,
    mask_losses,
    unit_cap,
)
from dpsynth_ml.models.model_io import read_model_info
from dpsynth_ml.training.finetune import checkpoints as ft_checkpoints
from dpsynth_ml.training.finetune import loop as ft_loop
from dpsynth_ml.training.finetune import setup as ft_setup
from dpsynth_ml.training.per_label import _class_subset, class_run

from .dp_support import (
    NUM_CLASSES,
    Examples,
    ZeroNoise,
    draw_loss,
    examples,
    make_engine,
    one_thread,
    tiny_denoiser,
)
from .recording import KeyedDraws, RecordingEngine, RecordingSampler, recording
from .support import IMAGE_SIZE, RecordingHooks, finetune_spec, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread", "recording"]

DECLARED = 2000  # N̂, public
BATCH = 40  # expected batch size: q = 40 / 2000
#: A generous bound on the ratio of median step times of runs doing the same work (measured
#: 0.94-1.19 on a loaded 2-core machine). The trainer before padding gave 0.38 (true N 500
#: vs 2,000), 0.45 (a class of 60 vs 400) and 0.04 (an empty class), far outside it.
RATIO_BOUND = 1.6


def _exact_sf(c: int, n: int, q: float) -> float:
    """P[Binomial(n, q) > c] summed term by term in log space (independent of scipy)."""
    log_q, log_1q = math.log(q), math.log1p(-q)
    return math.fsum(math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                              + k * log_q + (n - k) * log_1q) for k in range(c + 1, n + 1))


@pytest.mark.parametrize(("n", "q", "tail"), [(200, 0.05, 1e-9), (100, 0.16, 1e-14),
                                              (60, 0.5, 1e-20), (7, 0.3, 1e-3)])
def test_the_cap_is_the_smallest_with_overflow_below_the_tail(n: int, q: float,
                                                              tail: float) -> None:
    cap = unit_cap(n, q, tail)
    assert _exact_sf(cap, n, q) <= tail * (1 + 1e-6)
    assert cap == 1 or _exact_sf(cap - 1, n, q) > tail * (1 - 1e-6)


def test_the_fixed_work_comes_from_public_numbers_and_bounds_delta_timing() -> None:
    eps, delta, steps = 4.0, 1e-6, 500
    fixed = fixed_batch(sample_rate=BATCH / DECLARED, expected_batch_size=BATCH, steps=steps,
                        epsilon=eps, delta=delta)
    eta = 1e-3 * delta / (1 + math.exp(eps))
    assert fixed.population == DECLARED
    assert fixed.overflow_bound == pytest.approx(eta, rel=1e-12)
    assert fixed.delta_timing == pytest.approx(1e-3 * delta, rel=1e-12)
    # union bound over the T steps: P[any step overflows] <= T * sf(cap) <= eta
    assert steps * _exact_sf(fixed.units, DECLARED, BATCH / DECLARED) <= eta * (1 + 1e-6)
    assert fixed.rows == fixed.units and fixed.rows_for(0) == fixed.rows_for(fixed.rows)
    assert fixed.rows_for(fixed.rows + 1) == 2 * fixed.rows  # overflow: processed whole
    # W ranks: each shard's cap at eta / (T W); subjects: m image rows per unit
    ranked = fixed_batch(sample_rate=BATCH / DECLARED, expected_batch_size=BATCH,
                         steps=steps, epsilon=eps, delta=delta, world_size=4,
                         rows_per_unit=3)
    assert ranked.population == DECLARED // 4 and ranked.rows == 3 * ranked.units
    assert 4 * steps * _exact_sf(ranked.units, DECLARED // 4, BATCH / DECLARED) <= eta * (
        1 + 1e-6)


@pytest.mark.parametrize("draws", [1, 2])
def test_a_padded_step_releases_exactly_the_unpadded_clipped_sum(draws: int) -> None:
    """Padding rows (loss x 0) have per-example gradient exactly 0: the clipped sum, and
    with the same noise the released update, equal the unpadded step's."""
    model = tiny_denoiser()
    ex = examples(5, draws, seed=3)
    pad = examples(4, draws, seed=4)  # draws for the padding rows (their data: zeros)
    padded_ex = Examples(latents=torch.cat([ex.latents, torch.zeros_like(pad.latents)]),
                         labels=torch.cat([ex.labels, torch.full((4,), NUM_CLASSES)]),
                         timesteps=torch.cat([ex.timesteps, pad.timesteps]),
                         noise=torch.cat([ex.noise, pad.noise]))
    rows = torch.arange(len(padded_ex))
    real = rows < len(ex)
    released: dict[str, torch.Tensor] = {}
    # "sum": no noise at all (an injected zero source, test code only)
    for name, noise in (("sum", ZeroNoise), ("noised", None)):
        for padded in (False, True):
            engine = make_engine(model, sigma=1.0, clip=0.05, expected=4, seed=11,
                                 noise=noise() if noise is not None else None)
            use = rows if padded else rows[real]
            for start in range(0, len(use), 3):
                chunk = use[start:start + 3]
                counter = iter(range(draws))

                def draw(chunk: torch.Tensor = chunk, c: Iterator[int] = counter
                         ) -> torch.Tensor:
                    return mask_losses(draw_loss(engine.module, padded_ex, chunk, next(c)),
                                       real[chunk])

                engine._draw_passes(draw, draws)
                norms = engine.per_sample_norms()
                assert torch.all(norms[~real[chunk]] == 0)  # exactly zero gradients
                engine._clip_and_sum()
            engine.privatize()
            released[f"{name}-{padded}"] = torch.cat(
                [p.grad.detach().flatten() for p in engine.params])
            engine.close()
        torch.testing.assert_close(released[f"{name}-True"], released[f"{name}-False"],
                                   rtol=0, atol=1e-12)
    assert released["sum-True"].abs().max() > 1e-4  # a real sum, not zeros


@pytest.mark.usefixtures("recording")
@pytest.mark.parametrize(("rate", "steps"), [(0.16, 3), (1.0, 2)])
def test_the_trainer_s_padded_steps_release_the_unpadded_updates(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, rate: float, steps: int) -> None:
    # Same generator => same Poisson samples and DP noise (no label dropout, diffusion draws
    # keyed by example); the only difference is the padding (R rows vs. the batch alone).
    # rate 1.0 with B = 16 declares N̂ = 16 < the 100 records: every step overflows and is
    # processed whole in extra padded chunks (7 x 16 rows), never truncated.
    runs = {}
    real_fixed = ft_setup.fixed_batch
    for padded in (True, False):
        def fixed(**kwargs: Any) -> FixedBatch:
            public = real_fixed(**kwargs)
            if padded:
                return public
            return FixedBatch(public.population, 1, 1, public.overflow_bound, None)

        draws = KeyedDraws()
        monkeypatch.setattr(ft_setup, "fixed_batch", fixed)
        monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", draws)
        spec = finetune_spec(dp_steps=steps, dp_sample_rate=rate, label_dropout=0.0,
                             class_map={i: i for i in range(10)}, checkpoint_every=steps,
                             max_physical_batch_size=8, noise_multiplicity=2)
        train(spec, dataset_path=digits_path, out_dir=tmp_path / str(padded),
              base_model_dir=pretrained.model_dir, _test_generator=seeded(6))
        runs[padded] = (RecordingEngine.instances[-1], RecordingSampler.instances[-1], draws)
    (pad_engine, pad_sampler, pad_draws), (engine, sampler, plain_draws) = runs[True], runs[
        False]
    sizes = [len(b) for b in sampler.batches]
    assert all(torch.equal(a, b) for a, b in zip(pad_sampler.batches, sampler.batches,
                                                 strict=True))
    assert plain_draws.rows == 2 * sum(sizes) < pad_draws.rows  # the padding really ran
    public = fixed_batch(sample_rate=rate, expected_batch_size=16, steps=steps, epsilon=None,
                         delta=None)
    assert pad_draws.rows == 2 * sum(public.rows_for(s) for s in sizes)
    for a, b in zip(pad_engine.released, engine.released, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert max(float(r.abs().max()) for r in engine.released) > 0


# --- the deterministic core and the timing, whole dataset ---------------------------------

def _random_images(path: Path, n: int, labels: np.ndarray, names: list[str]) -> Path:
    rng = np.random.default_rng(n)
    np.savez(path, images=rng.integers(0, 255, (n, IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8),
             labels=labels, class_names=np.array(names))
    return path


class RowCounter:
    """The real diffusion loss, counting the rows of every forward pass per named run."""

    def __init__(self) -> None:
        self.real = ft_loop.per_sample_diffusion_loss
        self.current = ""
        self.rows: dict[str, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.rows[self.current] = self.rows.get(self.current, 0) + int(args[2].shape[0])
        return self.real(*args, **kwargs)  # type: ignore[no-any-return]


def _prepared(spec: FinetuneTraining, pretrained: TrainingResult, out_dir: Path, *,
              dataset_path: Path, dataset: Any = None, seed: int) -> Any:
    run = ft_setup.prepare(spec, dataset_path=dataset_path, out_dir=out_dir,
                                   base_model_dir=pretrained.model_dir, resume_from=None,
                                   generator=seeded(seed), rng="test", dataset=dataset)
    ft_checkpoints.attach_schedule_and_ema(run, None)
    return run


def _interleaved(runs: dict[str, Any], steps: int, counter: RowCounter
                 ) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Step the runs in turn (rotating the order), timing each logical step."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    rows: dict[str, list[int]] = {name: [] for name in runs}
    names = list(runs)
    for i in range(steps):
        for name in names[i % len(names):] + names[:i % len(names)]:
            counter.current, counter.rows[name] = name, 0
            start = time.perf_counter()
            ft_loop.logical_step(runs[name])
            times[name].append(time.perf_counter() - start)
            rows[name].append(counter.rows[name])
    return times, rows


def _median_ratio(a: list[float], b: list[float], warmup: int = 2) -> float:
    return statistics.median(a[warmup:]) / statistics.median(b[warmup:])


def test_per_step_rows_and_time_do_not_depend_on_the_true_size(
        pretrained: TrainingResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """N̂ = 2,000 declared; true N = 2,000 vs 500."""
    counter = RowCounter()
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", counter)
    spec = finetune_spec(dp_sample_rate=BATCH / DECLARED, dp_expected_batch_size=BATCH,
                         dp_steps=1000, max_physical_batch_size=64, num_classes=10)
    runs = {}
    for n in (DECLARED, 500):
        path = _random_images(tmp_path / f"{n}.npz", n, np.arange(n) % 10,
                              [f"digit {i}" for i in range(10)])
        runs[str(n)] = _prepared(spec, pretrained, tmp_path / str(n), dataset_path=path,
                                 seed=n)
    times, rows = _interleaved(runs, 12, counter)
    expected = fixed_batch(sample_rate=BATCH / DECLARED, expected_batch_size=BATCH,
                           steps=1000, epsilon=None, delta=None).rows
    # the deterministic core: the same rows every step, for either true size
    assert rows["2000"] == rows["500"] == [expected] * 12
    ratio = _median_ratio(times["500"], times["2000"])
    assert 1 / RATIO_BOUND < ratio < RATIO_BOUND, (ratio, times)


# --- per label: classes of different true sizes, one without records ----------------------

CLASS_NAMES = ["big", "small", "empty"]
CLASS_TRUE = {"big": 400, "small": 60, "empty": 0}
CLASS_DECLARED, CLASS_BATCH, CLASS_STEPS = 400, 16, 4


@pytest.fixture()
def per_label_data(tmp_path: Path) -> Path:
    labels = np.concatenate([np.full(CLASS_TRUE[c], i) for i, c in enumerate(CLASS_NAMES)])
    return _random_images(tmp_path / "classes.npz", len(labels), labels.astype(np.int64),
                          CLASS_NAMES)


def _per_label_spec(steps: int = CLASS_STEPS) -> FinetuneTraining:
    same = DpSpec(noise_multiplier=1.0, sample_rate=CLASS_BATCH / CLASS_DECLARED,
                  expected_batch_size=CLASS_BATCH, max_grad_norm=1.0, steps=steps,
                  epsilon=2.0, delta=1e-5)
    return FinetuneTraining(image_size=IMAGE_SIZE, num_classes=3, max_physical_batch_size=32,
                            checkpoint_every=steps, learning_rate=1e-3,
                            privacy=PerLabel({c: RecordLevel(same) for c in CLASS_NAMES}))


def test_every_class_s_steps_run_the_same_rows_an_empty_class_included(
        pretrained: TrainingResult, per_label_data: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    counter = RowCounter()
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", counter)
    per_step: list[int] = []

    class StepRows(RecordingHooks):
        def on_progress(self, step: int, total: int) -> None:
            super().on_progress(step, total)
            per_step.append(counter.rows.pop("", 0))

    result = train(_per_label_spec(), dataset_path=per_label_data, out_dir=tmp_path / "out",
                   hooks=StepRows(), base_model_dir=pretrained.model_dir,
                   _test_generator=seeded(2))
    assert result.steps_by_partition == dict.fromkeys(CLASS_NAMES, CLASS_STEPS)
    fixed = fixed_batch(sample_rate=CLASS_BATCH / CLASS_DECLARED,
                        expected_batch_size=CLASS_BATCH, steps=CLASS_STEPS, epsilon=2.0,
                        delta=1e-5)
    assert per_step == [fixed.rows] * (3 * CLASS_STEPS)
    assert fixed.delta_timing == pytest.approx(1e-8)
    # the manifest's model info names every class's fixed work
    info = read_model_info(result.model_dir)
    assert info.extra["fixed_batch_by_partition"] == dict.fromkeys(CLASS_NAMES, fixed.record())
    assert "fixed_batch" not in info.extra


def test_every_class_encodes_as_many_rows_as_its_declared_size(
        pretrained: TrainingResult, per_label_data: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_ml.models import architectures as models
    from dpsynth_ml.models import codec
    from dpsynth_ml.training.per_label import _PerLabelJob

    encoded: list[int] = []

    def counting(vae: Any, images: np.ndarray, **kwargs: Any) -> torch.Tensor:
        encoded.append(len(images))
        return models.encode_images(vae, images, **kwargs)

    # the finetune's records and the padded encoding's blanks both go through the codec
    monkeypatch.setattr(codec, "encode_images", counting)
    dataset = load_dataset(per_label_data)
    job = _PerLabelJob(_per_label_spec(), dataset=dataset, dataset_path=per_label_data,
                       out_dir=tmp_path, hooks=RecordingHooks(),
                       base_model_dir=pretrained.model_dir, generator=seeded(3), rng="test")
    totals = {}
    for i, name in enumerate(CLASS_NAMES):
        encoded.clear()
        _prepared(class_run(job.spec, dataset, name)[0], pretrained, tmp_path / name,
                  dataset_path=per_label_data, dataset=_class_subset(dataset, i), seed=i)
        totals[name] = sum(encoded)
    # the records and then blanks up to N̂_c (a class without records encodes one blank
    # image for its latents' shape, then N̂_c blanks)
    assert totals == {"big": CLASS_DECLARED, "small": CLASS_DECLARED,
                      "empty": CLASS_DECLARED + 1}


def test_per_step_time_is_the_same_for_classes_of_different_true_sizes(
        pretrained: TrainingResult, per_label_data: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_ml.training.per_label import _PerLabelJob

    counter = RowCounter()
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", counter)
    spec = _per_label_spec(steps=1000)
    dataset = load_dataset(per_label_data)
    job = _PerLabelJob(spec, dataset=dataset, dataset_path=per_label_data, out_dir=tmp_path,
                       hooks=RecordingHooks(), base_model_dir=pretrained.model_dir,
                       generator=seeded(3), rng="test")
    runs = {name: _prepared(class_run(job.spec, dataset, name)[0], pretrained, tmp_path / name,
                            dataset_path=per_label_data, dataset=_class_subset(dataset, i),
                            seed=i)
            for i, name in enumerate(CLASS_NAMES)}
    times, rows = _interleaved(runs, 12, counter)
    assert rows["big"] == rows["small"] == rows["empty"] == [rows["big"][0]] * 12
    for name in ("small", "empty"):
        ratio = _median_ratio(times[name], times["big"])
        assert 1 / RATIO_BOUND < ratio < RATIO_BOUND, (name, ratio, times)


# --- subjects ----------------------------------------------------------------------------

def test_user_level_steps_run_cap_subjects_times_m_rows(
        pretrained: TrainingResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = RowCounter()
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", counter)
    declared, m = 40, 3
    rows: dict[int, list[int]] = {}
    for subjects in (40, 10):  # true subject counts under the same declared N̂
        n = 3 * subjects
        path = _random_images(tmp_path / f"s{subjects}.npz", n, np.arange(n) % 10,
                              [f"digit {i}" for i in range(10)])
        with np.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files}
        np.savez(path, **arrays, subjects=np.arange(n) % subjects)
        spec = finetune_spec(privacy_unit="subject", max_images_per_subject=m,
                             dp_sample_rate=4 / declared, dp_expected_batch_size=4,
                             dp_steps=3, checkpoint_every=3, max_physical_batch_size=8)
        counter.rows = {}
        seen: list[int] = []

        class StepRows(RecordingHooks):
            def on_progress(self, step: int, total: int, seen: list[int] = seen) -> None:
                seen.append(counter.rows.pop("", 0))

        train(spec, dataset_path=path, out_dir=tmp_path / str(subjects), hooks=StepRows(),
              base_model_dir=pretrained.model_dir, _test_generator=seeded(subjects))
        rows[subjects] = seen
    fixed = fixed_batch(sample_rate=4 / declared, expected_batch_size=4, steps=3,
                        epsilon=None, delta=None, rows_per_unit=m)
    assert rows[40] == rows[10] == [fixed.rows] * 3 and fixed.rows == m * fixed.units
