"""The one-shot releases' Gaussian source (issue 13, item 7): OS CSPRNG bits, Box–Muller in
float64, the sum-of-four mitigation; N(loc, scale²) with no generator state to seed."""

from __future__ import annotations

import math
import secrets

import numpy as np
import pytest
from dpsynth_shared import secure_noise
from dpsynth_shared.secure_noise import SecureNormal
from scipy import stats


def test_draws_are_gaussian_with_the_requested_scale() -> None:
    draws = SecureNormal().normal(0.0, 3.0, size=40_000)
    assert draws.shape == (40_000,) and draws.dtype == np.float64
    assert stats.kstest(draws / 3.0, "norm").pvalue > 1e-3
    assert abs(draws.mean()) < 5 * 3.0 / math.sqrt(40_000)
    assert draws.std() == pytest.approx(3.0, rel=0.03)
    shifted = SecureNormal().normal(10.0, 0.5, size=5_000)
    assert shifted.mean() == pytest.approx(10.0, abs=0.05)


def test_each_value_sums_four_box_muller_draws_of_os_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value takes 4 uniforms of 53 bits from ``secrets`` and is (z1+z2+z3+z4)·σ/2."""
    bits = iter([0, 2**52, 2**51, 2**50 + 7])
    calls: list[int] = []

    def randbits(k: int) -> int:
        calls.append(k)
        return next(bits)

    monkeypatch.setattr(secrets, "randbits", randbits)
    value = float(SecureNormal().normal(0.0, 2.0))
    assert calls == [53, 53, 53, 53]
    u = [(b + 1) * 2.0**-53 for b in (0, 2**52, 2**51, 2**50 + 7)]
    z = []
    for r, a in ((u[0], u[1]), (u[2], u[3])):
        radius = math.sqrt(-2.0 * math.log(r))
        z += [radius * math.cos(2 * math.pi * a), radius * math.sin(2 * math.pi * a)]
    assert value == pytest.approx(sum(z) * 2.0 / 2.0, rel=1e-15)


def test_no_numpy_generator_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a seeded numpy generator was used")

    monkeypatch.setattr(np.random, "default_rng", refuse)
    assert SecureNormal().normal(0.0, 1.0, size=3).shape == (3,)
    assert secure_noise.SecureNormal().normal().shape == ()


def test_the_releases_use_it_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The api's DP count and class-size histogram, the worker's DP evaluation."""
    from dpsynth_api.datasets.class_sizes import noisy_class_sizes
    from dpsynth_api.datasets.units import noisy_size
    from dpsynth_ml.evaluation.dp import release_accuracies
    from dpsynth_worker.runners.evaluate_dp import os_generator

    used: list[int] = []
    real = SecureNormal.normal

    def counting(self: SecureNormal, loc: float = 0.0, scale: float = 1.0,
                 size: int | None = None) -> np.ndarray:
        used.append(1)
        return real(self, loc, scale, size)

    monkeypatch.setattr(SecureNormal, "normal", counting)
    monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("seeded numpy generator")))
    assert noisy_size(100, 1.0) >= 1
    assert set(noisy_class_sizes({"a": 5, "b": 7}, 1.0, 50)) == {"a", "b"}
    assert len(release_accuracies([5], sigma=1.0, holdout_size=10, rng=os_generator())) == 1
    assert len(used) == 3


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="scale"):
        SecureNormal().normal(0.0, -1.0, size=1)
    with pytest.raises(ValueError, match="size"):
        SecureNormal().normal(0.0, 1.0, size=-1)
