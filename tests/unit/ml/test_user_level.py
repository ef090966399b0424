"""User-level DP-SGD (privacy unit ``subject``): Poisson over subjects, ONE clipped
contribution per subject (the mean gradient of its sampled images), noise on the sum.

Engine tests use the tiny float64 denoiser with fixed per-example draws (dp_support), so a
subject's contribution is a deterministic function of its own images; the sampler tests are
statistical with a fixed seed and wide, stated tolerances (no timing anywhere).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import InvalidSpecError, PretrainTraining, TrainingResult, train
from dpsynth_ml.data import load_dataset
from dpsynth_ml.dp import DpSgdEngine, SubjectPoissonSampler
from dpsynth_ml.training.per_label import _class_subset

from .dp_support import (
    Examples,
    ZeroNoise,
    clip_rows,
    draw_loss,
    examples,
    make_engine,
    one_thread,
    reference_grads,
    tiny_denoiser,
)
from .support import RecordingHooks, finetune_spec, seeded, write_digits

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread"]

# Subject 0 owns 6 images; subjects 1..3 own 2, 1 and 1.
SUBJECTS = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 2, 3])


def subject_sum(engine: DpSgdEngine, ex: Examples, rows: torch.Tensor,
                subjects: torch.Tensor, *, draws: int, micro: int,
                seen: list[int] | None = None) -> torch.Tensor:
    """One user-level logical step over ``rows`` (grouped by subject), without updating.

    Mirrors the trainer's ``_subject_batches``: weights 1/n_j, micro-batches of ``micro``
    examples, a subject cut by a boundary carried into the next micro-batch.

    Returns:
        The released sum (one clipped contribution per subject + noise), flattened.
    """
    order = torch.argsort(subjects[rows], stable=True)
    rows, subj = rows[order], subjects[rows][order]
    _, groups, counts = torch.unique_consecutive(subj, return_inverse=True, return_counts=True)
    weights = (1.0 / counts.double())[groups]
    size = len(rows)
    for start in range(0, size, micro):
        end = min(start + micro, size)
        chunk = rows[start:end]
        counter = iter(range(draws))

        def draw(chunk: torch.Tensor = chunk, c: object = counter) -> torch.Tensor:
            if seen is not None:
                seen.append(len(chunk))
            return draw_loss(engine.module, ex, chunk, next(c))  # type: ignore[call-overload]

        engine.accumulate_subject_draws(
            draw, draws, groups[start:end] - groups[start], weights[start:end],
            carry_in=start > 0 and bool(groups[start] == groups[start - 1]),
            carry_out=end < size and bool(groups[end] == groups[end - 1]))
        for p in engine.params:  # per-sample rows live only inside one micro-batch
            assert p.grad_sample is None
        assert engine._carried is None or all(
            c.shape == p.shape for c, p in zip(engine._carried, engine.params, strict=True))
    engine.privatize()
    flat = torch.cat([p.grad.detach().flatten() for p in engine.params])
    engine.discard()
    return flat * engine.optimizer.expected_batch_size


def expected_subject_sum(ref: torch.Tensor, subjects: torch.Tensor,
                         clip: float) -> torch.Tensor:
    """sum_j clip_C(mean_{i in j} mean_k g_ik), by plain autograd."""
    per_example = ref.mean(dim=1)
    means = torch.stack([per_example[subjects == j].mean(dim=0)
                         for j in torch.unique(subjects).tolist()])
    return clip_rows(means, clip).sum(dim=0)


@pytest.mark.parametrize(("draws", "micro"), [(1, 4), (2, 3), (1, 10), (1, 1)])
def test_each_subject_contributes_one_clipped_mean(draws: int, micro: int) -> None:
    model = tiny_denoiser()
    ex = examples(len(SUBJECTS), draws, seed=5)
    rows = torch.arange(len(ex))
    ref = reference_grads(model, ex, rows, draws)
    clip = 0.5 * float(ref.mean(dim=1).norm(dim=-1).median())
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=2)
    got = subject_sum(engine, ex, rows, SUBJECTS, draws=draws, micro=micro)
    torch.testing.assert_close(got, expected_subject_sum(ref, SUBJECTS, clip),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("draws", [1, 2])
def test_removing_a_subject_moves_the_sum_by_at_most_c_whatever_its_image_count(
        draws: int) -> None:
    model = tiny_denoiser()
    ex = examples(len(SUBJECTS), draws, seed=11)
    rows = torch.arange(len(ex))
    ref = reference_grads(model, ex, rows, draws)
    # clipping is active for every subject's mean, so the bound is attained
    clip = 0.5 * float(ref.mean(dim=1).norm(dim=-1).min()) / 4
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=2)
    full = subject_sum(engine, ex, rows, SUBJECTS, draws=draws, micro=4)
    moved = {}
    for j in torch.unique(SUBJECTS).tolist():
        keep = rows[SUBJECTS != j]
        moved[j] = float((full - subject_sum(engine, ex, keep, SUBJECTS, draws=draws,
                                             micro=4)).norm())
    assert max(moved.values()) <= clip * (1 + 1e-9)
    assert moved[0] > 0.999 * clip  # the 6-image subject moves it by C, not 6 C
    # record-level clipping of the same images: subject 0's six clipped rows move the sum
    # by far more than C (that is why a subject dataset never trains per image)
    per_image = clip_rows(ref.mean(dim=1), clip)
    assert float(per_image[SUBJECTS == 0].sum(dim=0).norm()) > 2 * clip


def test_a_subject_cut_by_a_micro_batch_is_clipped_once_and_memory_stays_bounded() -> None:
    model = tiny_denoiser()
    subjects = torch.zeros(9, dtype=torch.long)  # one subject, nine images
    ex = examples(9, 1, seed=2)
    rows = torch.arange(9)
    ref = reference_grads(model, ex, rows, 1)
    clip = 0.1 * float(ref.mean(dim=1).mean(dim=0).norm())
    engine = make_engine(model, sigma=1.0, noise=ZeroNoise(), clip=clip, expected=1)
    seen: list[int] = []
    got = subject_sum(engine, ex, rows, subjects, draws=1, micro=2, seen=seen)
    assert max(seen) <= 2  # forward/backward never sees more than one micro-batch
    assert 0.999 * clip < float(got.norm()) <= clip  # one clip (opacus: C / (norm + 1e-6))
    torch.testing.assert_close(got, expected_subject_sum(ref, subjects, clip),
                               rtol=1e-9, atol=1e-12)


def test_subject_sampler_includes_each_subject_with_probability_q() -> None:
    # 2000 subjects: half with 1 image, half with 5; q = 0.1; 60 draws (seed fixed).
    # Each group's inclusion frequency is a mean of 60,000 Bernoulli(q) draws: std ~0.0012,
    # tolerance 0.01 (~8 std). Inclusion does not depend on a subject's image count.
    sizes = np.array([1] * 1000 + [5] * 1000)
    subjects = np.repeat(np.arange(2000), sizes)
    q, draws = 0.1, 60
    sampler = SubjectPoissonSampler(subjects, 2000, q, seeded(3), max_images_per_subject=3)
    hits = np.zeros(2000)
    for _ in range(draws):
        batch = sampler.sample()
        hits[batch.subjects.numpy()] += 1
        counts = dict(zip(batch.subjects.tolist(), batch.counts.tolist(), strict=True))
        assert all(counts[s] == min(3, sizes[s]) for s in counts)  # the cap, exactly
        assert torch.equal(batch.groups, torch.repeat_interleave(
            torch.arange(batch.num_subjects), batch.counts))
        assert torch.equal(torch.as_tensor(subjects)[batch.indices],
                           batch.subjects[batch.groups])
    assert abs(hits[:1000].mean() / draws - q) < 0.01
    assert abs(hits[1000:].mean() / draws - q) < 0.01
    assert sampler.draws == draws


def test_capped_images_are_chosen_uniformly() -> None:
    # One subject of 5 images, cap 2: each image is chosen with probability 2/5.
    # 4000 draws at q = 1: std of a frequency ~0.008; tolerance 0.05 (~6 std).
    sampler = SubjectPoissonSampler(np.zeros(5, dtype=np.int64), 1, 1.0, seeded(9),
                                    max_images_per_subject=2)
    chosen = np.zeros(5)
    for _ in range(4000):
        batch = sampler.sample()
        assert batch.indices.numel() == 2 and len(set(batch.indices.tolist())) == 2
        chosen[batch.indices.numpy()] += 1
    assert np.all(np.abs(chosen / 4000 - 0.4) < 0.05)


def test_a_subject_without_images_never_contributes() -> None:
    # Dense ids 0..9, but this view (a class subset) holds images of subjects 2 and 7 only.
    subjects = np.array([2, 2, 7])
    sampler = SubjectPoissonSampler(subjects, 10, 1.0, seeded(1), max_images_per_subject=8)
    batch = sampler.sample()
    assert batch.subjects.tolist() == [2, 7]
    assert batch.counts.tolist() == [2, 1]
    empty = SubjectPoissonSampler(np.zeros(0, dtype=np.int64), 4, 1.0, seeded(1),
                                  max_images_per_subject=8).sample()
    assert empty.num_subjects == 0 and empty.indices.numel() == 0


def test_sampler_refuses_ids_outside_the_subject_count() -> None:
    with pytest.raises(ValueError, match="dense"):
        SubjectPoissonSampler(np.array([0, 3]), 3, 0.5, seeded(), max_images_per_subject=1)


# -- through the ML core ------------------------------------------------------------------

NUM_SUBJECTS = 30


@pytest.fixture(scope="module")
def subject_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits with 30 subjects owning 1..7 images each (some in several classes)."""
    path = write_digits(tmp_path_factory.mktemp("subjects") / "digits.npz")
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    rng = np.random.default_rng(0)
    arrays["subjects"] = rng.integers(0, NUM_SUBJECTS, size=arrays["images"].shape[0])
    arrays["subjects"][:NUM_SUBJECTS] = np.arange(NUM_SUBJECTS)  # every subject has one
    np.savez(path, **arrays)
    return path


def test_subjects_load_and_follow_a_class_subset(subject_digits: Path) -> None:
    data = load_dataset(subject_digits)
    assert data.subjects is not None and data.num_subjects == NUM_SUBJECTS
    part = _class_subset(data, 3)
    assert part.num_subjects == NUM_SUBJECTS
    assert part.subjects is not None
    assert np.array_equal(part.subjects, data.subjects[data.labels == 3])


def test_user_level_finetune_runs_end_to_end(subject_digits: Path, pretrained: TrainingResult,
                                             tmp_path: Path) -> None:
    spec = finetune_spec(privacy_unit="subject", max_images_per_subject=3,
                         max_physical_batch_size=4, checkpoint_every=3,
                         dp_sample_rate=4 / NUM_SUBJECTS, dp_expected_batch_size=4,
                         dp_steps=3, noise_multiplicity=2)
    hooks = RecordingHooks()
    result = train(spec, dataset_path=subject_digits, out_dir=tmp_path / "out", hooks=hooks,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded(4))
    assert result.steps_completed == 3 and not result.stopped_early
    assert (result.model_dir / "dpsynth_model.json").is_file()
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["sampler"]["unit"] == "subject"
    assert state["sampler"]["num_records"] == NUM_SUBJECTS
    assert state["sampler"]["max_images_per_subject"] == 3
    assert len(hooks.private_stats) == 3
    for stats in hooks.private_stats:  # batch_size counts subjects, at most 3 images each
        assert stats["images"] <= 3 * stats["batch_size"]


def test_the_unit_of_the_job_and_of_the_data_must_agree(
        subject_digits: Path, digits_path: Path, pretrained: TrainingResult,
        tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match="subject"):
        train(finetune_spec(dp_steps=1), dataset_path=subject_digits,
              out_dir=tmp_path / "a", base_model_dir=pretrained.model_dir,
              _test_generator=seeded())
    with pytest.raises(InvalidSpecError, match="subjects"):
        train(finetune_spec(privacy_unit="subject", dp_steps=1), dataset_path=digits_path,
              out_dir=tmp_path / "b", base_model_dir=pretrained.model_dir,
              _test_generator=seeded())
    # only a finetune has a privacy block, so only a finetune can be user-level
    assert "privacy" not in {f.name for f in dataclasses.fields(PretrainTraining)}
    with pytest.raises(InvalidSpecError, match="max_images_per_subject"):
        finetune_spec(privacy_unit="subject", max_images_per_subject=0)


def test_per_label_user_level_runs_each_class_over_its_subjects(
        pretrained: TrainingResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per label on a subject dataset: each class's run samples subjects (over the dataset's
    S, at its own q_c) and sees only the class's images; subject 0 has images in both."""
    from dpsynth_ml import DpSpec, FinetuneTraining, PerLabel, SubjectLevel
    from dpsynth_ml.training.finetune import setup as ft_setup
    from sklearn.datasets import load_digits

    from .support import IMAGE_SIZE

    digits = load_digits()
    keep = np.flatnonzero(digits.target < 2)[:16]
    images = (digits.images[keep] / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    labels = digits.target[keep].astype(np.int64)
    subjects = np.arange(16) % 6  # 6 subjects; most have images in both classes
    path = tmp_path / "two.npz"
    np.savez(path, images=images, labels=labels, class_names=np.array(["zero", "one"]),
             subjects=subjects)
    samplers: list[object] = []
    real_prepare = ft_setup.prepare

    def prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        run = real_prepare(*args, **kwargs)
        samplers.append(run.sampler)
        return run

    monkeypatch.setattr(ft_setup, "prepare", prepare)
    rates = {"zero": 0.5, "one": 0.4}
    spec = FinetuneTraining(
        image_size=IMAGE_SIZE, num_classes=2, max_physical_batch_size=4, checkpoint_every=2,
        learning_rate=1e-3,
        privacy=PerLabel({c: SubjectLevel(DpSpec(noise_multiplier=1.0, sample_rate=q,
                                                 expected_batch_size=2, max_grad_norm=1.0,
                                                 steps=2), max_images_per_subject=2)
                          for c, q in rates.items()}))
    result = train(spec, dataset_path=path, out_dir=tmp_path / "out", hooks=RecordingHooks(),
                   base_model_dir=pretrained.model_dir, _test_generator=seeded(8))
    assert dict(result.steps_by_partition) == {"zero": 2, "one": 2}
    assert [type(s).__name__ for s in samplers] == ["SubjectPoissonSampler"] * 2
    for sampler, name in zip(samplers, ["zero", "one"], strict=True):
        assert isinstance(sampler, SubjectPoissonSampler)
        assert (sampler.num_records, sampler.sample_rate, sampler.draws) == (6, rates[name], 2)
