"""Fréchet distance: known answers (identical sets, the closed form of two Gaussians,
disjoint sets, rank-deficient covariances)."""

from __future__ import annotations

import numpy as np
import pytest
from dpsynth_ml.evaluation import (
    FeatureNet,
    FeatureNetInfo,
    extract_features,
    frechet_distance,
    frechet_distance_gaussians,
)
from dpsynth_ml.spec import InvalidSpecError

from .conftest import Digits

pytestmark = pytest.mark.unit


def test_identical_sets_give_zero() -> None:
    x = np.random.default_rng(0).normal(size=(300, 16))
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)


def test_closed_form_of_two_gaussians() -> None:
    # diagonal covariances: FD = |mu1-mu2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, -1.0])
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 0.25])
    expected = float(np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    assert frechet_distance_gaussians(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(
        expected, rel=1e-10)
    # a full covariance against itself rotated into a shifted mean: only the mean term
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(5, 5)))
    cov = q @ np.diag([5.0, 2.0, 1.0, 0.5, 0.0]) @ q.T  # singular
    assert frechet_distance_gaussians(np.zeros(5), cov, np.ones(5), cov) == pytest.approx(
        5.0, abs=1e-6)
    # samples approach the closed form
    rng = np.random.default_rng(2)
    xa = mu1 + rng.normal(size=(20000, 3)) * np.sqrt(a)
    xb = mu2 + rng.normal(size=(20000, 3)) * np.sqrt(b)
    assert frechet_distance(xa, xb) == pytest.approx(expected, rel=0.02)


def test_rank_deficient_and_small_sets() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 50))  # N << D
    y = rng.normal(size=(5, 50))
    value = frechet_distance(x, y)
    assert np.isfinite(value) and value > 0
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)
    const = np.ones((10, 4))
    assert frechet_distance(const, const + 2.0) == pytest.approx(16.0, abs=1e-10)
    with pytest.raises(InvalidSpecError):
        frechet_distance(x[:1], y)
    with pytest.raises(InvalidSpecError):
        frechet_distance(x, y[:, :10])


def test_features_same_distribution_small_disjoint_large(
        featnet: tuple[FeatureNet, FeatureNetInfo], digits: Digits) -> None:
    net, info = featnet
    held = extract_features(net, info, digits.images[1200:])
    half = len(held) // 2
    same = frechet_distance(held[:half], held[half:])
    assert frechet_distance(held, held) == pytest.approx(0.0, abs=1e-6)
    # disjoint: digits 0-4 against digits 5-9, and digits against noise
    labels = digits.labels[1200:]
    disjoint = frechet_distance(held[labels < 5], held[labels >= 5])
    noise = np.random.default_rng(4).integers(0, 256, size=(300, 8, 8, 1), dtype=np.uint8)
    far = frechet_distance(held, extract_features(net, info, noise))
    assert disjoint > 5 * same
    assert far > 5 * same


def test_agrees_with_scipy_sqrtm_on_well_conditioned_covariances() -> None:
    from scipy import linalg

    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(20, 20)), rng.normal(size=(20, 20))
    c1, c2 = a @ a.T + np.eye(20), b @ b.T + np.eye(20)
    mu1, mu2 = rng.normal(size=20), rng.normal(size=20)
    covmean = linalg.sqrtm(c1 @ c2).real
    reference = float(np.sum((mu1 - mu2) ** 2) + np.trace(c1) + np.trace(c2)
                      - 2 * np.trace(covmean))
    assert frechet_distance_gaussians(mu1, c1, mu2, c2) == pytest.approx(reference, rel=1e-8)
