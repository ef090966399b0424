"""Black-box audits of subject-level (user-level DP-SGD) finetunes (issue 19).

The privacy unit is the subject, so each canary is a subject of ``max_images_per_subject``
noise images of one label, in or out of the training set as a whole, beside N̂ - m
stand-in subjects (N̂ counts subjects); a canary's score is the mean of its images'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier, dp_sgd_epsilon
from dpsynth_ml import InvalidSpecError, TrainingResult, black_box_audit_finetune
from dpsynth_ml.audit import blackbox
from dpsynth_ml.audit.canary_sets import draw_canaries, subject_training_set
from dpsynth_ml.data import ImageDataset

from .support import finetune_spec, seeded

pytestmark = pytest.mark.unit

DELTA = 1e-5
Q, EXPECTED, STEPS, PER_SUBJECT = 0.25, 2, 3, 2  # N̂ = 8 subjects


def _stand_in(records: int, subjects: np.ndarray | None = None) -> ImageDataset:
    rng = np.random.default_rng(0)
    return ImageDataset(images=rng.integers(0, 256, (records, 16, 16, 1), dtype=np.uint8),
                        labels=np.arange(records, dtype=np.int64) % 3,
                        class_names=("a", "b", "c"), subjects=subjects,
                        num_subjects=None if subjects is None else int(subjects.max()) + 1)


@pytest.mark.parametrize("own_subjects", [False, True])
def test_canary_subjects_join_whole_beside_at_most_n_hat_minus_m_stand_in_subjects(
        own_subjects: bool) -> None:
    rng = np.random.default_rng(1)
    # 30 stand-in subjects of 2 images (its own, numbered backwards; else record pairs)
    data = _stand_in(60, np.repeat(np.arange(30), 2)[::-1].copy() if own_subjects else None)
    canaries = draw_canaries(data, 5, rng, None, per_unit=PER_SUBJECT)
    included = np.array([True, False, True, True, False])
    made = subject_training_set(data, canaries, included, population=12,
                                per_unit=PER_SUBJECT, rng=rng)
    train = made.dataset
    assert train.subjects is not None and train.num_subjects == 7 + 3  # (12 - 5) + 3 in
    assert made.stand_in_subjects == 7 and made.stand_in_records == 14
    assert sorted(set(train.subjects.tolist())) == list(range(10))  # dense 0..S-1
    # every included canary is all its images, one label, at subjects 7, 8, 9
    assert len(canaries) == 10 and np.array_equal(canaries.labels[::2], canaries.labels[1::2])
    tail = slice(14, None)
    assert np.array_equal(train.subjects[tail], [7, 7, 8, 8, 9, 9])
    assert np.array_equal(train.images[tail], canaries.images[[0, 1, 4, 5, 6, 7]])
    assert np.array_equal(train.labels[tail], canaries.labels[[0, 1, 4, 5, 6, 7]])
    # a stand-in subject is kept whole
    assert np.all(np.bincount(train.subjects[:14]) == 2)


def test_a_subject_level_black_box_audit_scores_canary_subjects(
        digits_path: Path, pretrained: TrainingResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    sigma = calibrate_noise_multiplier(1.0, Q, STEPS, DELTA)
    claimed = dp_sgd_epsilon(sigma, Q, STEPS, DELTA)
    spec = finetune_spec(privacy_unit="subject", max_images_per_subject=PER_SUBJECT,
                         max_physical_batch_size=4, dp_noise_multiplier=sigma,
                         dp_sample_rate=Q, dp_expected_batch_size=EXPECTED, dp_steps=STEPS)
    seen: list[ImageDataset] = []
    real = blackbox.run_finetune

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["dataset"])
        return real(*args, **kwargs)

    monkeypatch.setattr(blackbox, "run_finetune", spy)
    result = black_box_audit_finetune(
        spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir, canaries=4,
        delta=DELTA, generator=seeded(21), draws=2)
    assert result.bound.canaries == 4 and result.scores.shape == (4,)
    assert np.isfinite(result.scores).all() and result.steps == STEPS
    assert result.images_per_canary == PER_SUBJECT
    # the digits carry no subjects: pairs of records, cut to N̂ - m = 4 subjects
    assert result.stand_in_subjects == 4 and result.stand_in_records == 8
    assert result.bound.epsilon_lower_bound <= claimed  # honest mechanism, valid bound
    (train,) = seen
    assert train.num_subjects == 4 + result.included <= 8
    assert train.subjects is not None and len(train) == 2 * train.num_subjects
    assert np.array_equal(np.bincount(train.subjects), np.full(train.num_subjects, 2))
    with pytest.raises(InvalidSpecError, match="N̂ = 8 subjects: at most 4"):
        black_box_audit_finetune(spec, dataset_path=digits_path,
                                 base_model_dir=pretrained.model_dir, canaries=5,
                                 delta=DELTA, generator=seeded(22))


def test_a_class_runs_stand_in_keeps_only_subjects_with_an_image_there() -> None:
    """A per-label class's records keep their dataset's subject indices (some absent):
    the cut counts the present subjects only and the training set re-indexes densely."""
    rng = np.random.default_rng(2)
    data = _stand_in(6, np.array([9, 3, 9, 17, 3, 40]))  # 4 subjects present, S was 41
    canaries = draw_canaries(data, 2, rng, "b", per_unit=3)
    assert set(canaries.labels.tolist()) == {1}  # the audited class
    made = subject_training_set(data, canaries, np.array([True, True]), population=20,
                                per_unit=3, rng=rng)
    train = made.dataset
    assert made.stand_in_subjects == 4 and made.stand_in_records == 6  # all fit in 18
    assert train.num_subjects == 6 and train.subjects is not None
    assert np.array_equal(train.subjects, [1, 0, 1, 2, 0, 3, 4, 4, 4, 5, 5, 5])
