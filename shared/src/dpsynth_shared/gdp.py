"""Gaussian differential privacy (Dong, Roth and Su 2022), closed forms in pure Python.

A mechanism is mu-GDP when telling its outputs on two neighbours apart is no easier than
telling N(0, 1) from N(mu, 1). Its (eps, delta) profile is (their Corollary 2.13)::

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)

Used by the ledger (the GDP envelope of a claimed DP-SGD run) and by the ML core's f-DP
one-run audit (docs/privacy.md, "Empirical audits"), which report a GDP parameter also as
the epsilon it means at a dataset's delta.
"""

from __future__ import annotations

import math


def _log_phi(x: float) -> float:
    """log Φ(x), accurate in both tails (erfc is relative-accurate for a large argument)."""
    if x > 0:
        return math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0)))
    tail = 0.5 * math.erfc(-x / math.sqrt(2.0))
    if tail > 0:
        return math.log(tail)
    return -0.5 * x * x - math.log(-x) - 0.5 * math.log(2 * math.pi)  # Mills' ratio, x ≪ 0


def analytic_gaussian_delta(epsilon: float, multiplier: float) -> float:
    """δ(ε) of ONE Gaussian release of noise multiplier σ/Δ, exactly (Balle & Wang 2018,
    "Improving the Gaussian Mechanism for Differential Privacy", Thm. 8, add/remove):
    δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ). Decreasing in σ and in ε. (The
    ledger's one-shot calibration, ``dpsynth_ledger.accounting.gaussian``, uses it.)"""
    a = 1.0 / (2.0 * multiplier) - epsilon * multiplier
    b = -1.0 / (2.0 * multiplier) - epsilon * multiplier
    first, second = _log_phi(a), epsilon + _log_phi(b)
    if second >= first:
        return 0.0
    return math.exp(first) * -math.expm1(second - first)


def gdp_delta(mu: float, eps: float) -> float:
    """The smallest delta with which mu-GDP is (eps, delta)-DP: the Gaussian mechanism of
    noise multiplier 1 / mu (:func:`analytic_gaussian_delta`)."""
    if mu <= 0:
        return 0.0
    return analytic_gaussian_delta(eps, 1.0 / mu)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps >= 0 with which mu-GDP is (eps, delta)-DP (to ~1e-12).

    Raises:
        ValueError: unless mu >= 0 and 0 < delta < 1.
    """
    if mu < 0 or not 0 < delta < 1:
        raise ValueError("need mu >= 0 and 0 < delta < 1")
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while gdp_delta(mu, high) > delta:
        low, high = high, 2 * high
    for _ in range(200):
        mid = (low + high) / 2
        if gdp_delta(mu, mid) > delta:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return high


def gdp_mu(eps: float, delta: float) -> float:
    """The mu-GDP whose (eps, delta) profile passes through (eps, delta): the largest mu
    with gdp_delta(mu, eps) <= delta (to ~1e-12).

    Raises:
        ValueError: unless eps >= 0 and 0 < delta < 1.
    """
    if eps < 0 or not 0 < delta < 1:
        raise ValueError("need eps >= 0 and 0 < delta < 1")
    low, high = 0.0, 1.0
    while gdp_delta(high, eps) <= delta:
        low, high = high, 2 * high
    for _ in range(200):
        mid = (low + high) / 2
        if gdp_delta(mid, eps) <= delta:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return low
