"""Precision / recall / density / coverage and the memorisation check on known answers."""

from __future__ import annotations

import numpy as np
import pytest
from dpsynth_ml.evaluation import (
    MEMORISATION_RATIO,
    FeatureNet,
    FeatureNetInfo,
    extract_features,
    memorisation,
    prdc,
)
from dpsynth_ml.spec import InvalidSpecError
from dpsynth_shared.evaluation import Memorisation

from .conftest import Digits

pytestmark = pytest.mark.unit


def test_set_against_itself_is_perfect() -> None:
    x = np.random.default_rng(0).normal(size=(200, 8))
    scores = prdc(x, x, k=5)
    assert scores["precision"] == 1.0
    assert scores["recall"] == 1.0
    assert scores["coverage"] == 1.0
    assert scores["density"] >= 1.0  # each point is in its own ball and k-ish others


def test_disjoint_sets_score_zero_and_same_distribution_high() -> None:
    rng = np.random.default_rng(1)
    real = rng.normal(size=(400, 4))
    scores = prdc(real, rng.normal(size=(400, 4)) + 50.0, k=5)
    assert scores == {"precision": 0.0, "recall": 0.0, "density": 0.0, "coverage": 0.0}
    same = prdc(real, rng.normal(size=(400, 4)), k=5)
    assert same["precision"] > 0.8 and same["recall"] > 0.8 and same["coverage"] > 0.8
    assert 0.7 < same["density"] < 1.3


def test_mode_collapse_lowers_recall_and_coverage_not_precision() -> None:
    rng = np.random.default_rng(2)
    real = rng.normal(size=(400, 2))
    collapsed = rng.normal(size=(400, 2)) * 0.1  # all samples near the mode
    scores = prdc(real, collapsed, k=5)
    assert scores["precision"] > 0.95
    assert scores["recall"] < 0.3 and scores["coverage"] < 0.3


def test_prdc_rejects_too_small_sets() -> None:
    x = np.zeros((5, 3))
    with pytest.raises(InvalidSpecError):
        prdc(x, x, k=5)


def test_copies_are_flagged_fresh_samples_are_not(digits: Digits) -> None:
    train, holdout = digits.images[:600], digits.images[600:1200]
    fresh = digits.images[1200:1500]
    copies = train[:100]
    rng = np.random.default_rng(3)
    noisy = np.clip(train[100:200].astype(np.int16) + rng.integers(-8, 9, size=(100, 8, 8, 1)),
                    0, 255).astype(np.uint8)

    copied = memorisation(copies, train, holdout)
    assert copied.exact.all() and copied.flagged.all()
    np.testing.assert_array_equal(copied.nearest_train, np.arange(100))
    assert copied.summary()["exact_copies"] == 100

    near = memorisation(noisy, train, holdout)
    assert not near.exact.any()
    assert near.flagged.mean() > 0.9

    clean = memorisation(fresh, train, holdout)
    summary = clean.summary()
    assert summary["exact_copies"] == 0
    assert summary["flagged"] <= 0.02 * len(fresh)
    assert 0.3 < summary["fraction_closer_to_train"] < 0.7
    assert summary["median_ratio"] > 0.7
    assert summary["expected_fraction_closer_to_train"] == 0.5
    assert summary["threshold"] == pytest.approx(MEMORISATION_RATIO)
    Memorisation.model_validate(summary)

    mixed = memorisation(np.concatenate([fresh, copies[:10]]), train, holdout, pairs=10)
    assert sorted(mixed.closest.tolist()) == list(range(len(fresh), len(fresh) + 10))
    assert mixed.flagged[len(fresh):].all()


def test_feature_space_memorisation(featnet: tuple[FeatureNet, FeatureNetInfo],
                                    digits: Digits) -> None:
    net, info = featnet
    f_train = extract_features(net, info, digits.images[:600])
    f_hold = extract_features(net, info, digits.images[600:1200])
    f_fresh = extract_features(net, info, digits.images[1200:1500])
    copied = memorisation(f_train[:50], f_train, f_hold, space="features")
    assert copied.space == "features" and copied.flagged.all() and copied.exact.all()
    clean = memorisation(f_fresh, f_train, f_hold, space="features")
    assert clean.summary()["flagged"] <= 0.05 * len(f_fresh)
    Memorisation.model_validate(clean.summary())
