"""One-shot Gaussian releases: their reported ε and their calibration (issue 14, item 1).

A class-size histogram, a DP count of N̂ and a DP evaluation each release ONE Gaussian. Its
σ/Δ is the exact one of the analytic Gaussian mechanism (Balle & Wang 2018, closed form,
bounded time), raised until the figure the ledger reports, ``dp_accounting``'s pessimistic
PLD of the ``GaussianDpEvent``, meets the target too. Split from :mod:`.pld`, which keeps
the compositions of DP-SGD runs.
"""

from __future__ import annotations

import math
from functools import lru_cache

from dpsynth_shared.gdp import analytic_gaussian_delta

from dpsynth_ledger.accounting.pld import (
    DEFAULT_DISCRETIZATION,
    MAX_NOISE_MULTIPLIER,
    pld_of_key,
)


def gaussian_epsilon(noise_multiplier: float, delta: float,
                     discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """Standalone PLD ε at ``delta`` of ONE Gaussian release of noise multiplier σ/Δ (cached).

    ``dp_accounting``'s ``GaussianDpEvent`` under its PLD accountant (add/remove; the PLD of
    the Gaussian mechanism is the exact privacy loss of the analytic Gaussian mechanism of
    Balle & Wang 2018, discretised pessimistically).

    The interval is at least :func:`gaussian_pld_floor` of σ/Δ: the PLD of a small σ at a
    tiny interval has millions of points (σ/Δ = 0.74 at 1e-6: 54 s); a coarser interval only
    over-reports ε (pessimistic), never under-reports it.
    """
    interval = max(discretization, gaussian_pld_floor(noise_multiplier))
    return pld_of_key((("gaussian", noise_multiplier, 1.0, 1),), delta, interval)


GAUSSIAN_PLD_POINTS = 300_000
"""At most about this many points in a one-shot Gaussian's PLD (~0.2 s on one core)."""


def gaussian_pld_floor(noise_multiplier: float) -> float:
    """The smallest PLD interval for ONE Gaussian of multiplier σ/Δ: its privacy losses span
    about 20/(σ/Δ) (±10 standard deviations of (x − Δ/2)·Δ/σ²), so this keeps the PLD to
    :data:`GAUSSIAN_PLD_POINTS` points."""
    return 20.0 / (max(noise_multiplier, 1e-12) * GAUSSIAN_PLD_POINTS)


def gaussian_discretization(target_epsilon: float,
                            discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """The PLD interval for a one-shot Gaussian: at most 1e-3·target, so the pessimistic
    discretisation costs < 0.1 % of a small target (one Gaussian's PLD is cheap)."""
    return min(discretization, 1e-3 * target_epsilon)


ANALYTIC_RTOL = 1e-9
"""Relative width at which the analytic bisection stops (its upper end is kept)."""
MIN_GAUSSIAN_MULTIPLIER = 1e-2
"""The smallest one-shot noise multiplier calibration considers (ε ≤ 100 at δ ≤ 0.5 needs
more than 0.05; below it the PLD of the check would be millions of points)."""
_PLD_MARGIN_STEPS = 16


def analytic_gaussian_sigma(target_epsilon: float, delta: float) -> float:
    """The smallest noise multiplier σ/Δ (relative tolerance :data:`ANALYTIC_RTOL`, upper
    end) whose one-shot Gaussian release is (``target_epsilon``, ``delta``)-DP, by bisection
    on the closed form of :func:`analytic_gaussian_delta`: at most ~60 evaluations of
    ``erfc``, whatever the target (microseconds, not the PLD's seconds).

    Raises:
        ValueError: when even σ/Δ = 1e4 does not reach the target, or for a δ outside (0, 1).
    """
    if not (0.0 < delta < 1.0 and target_epsilon > 0.0):
        raise ValueError("a Gaussian calibration needs 0 < delta < 1 and a positive target")
    lo, hi = MIN_GAUSSIAN_MULTIPLIER, MAX_NOISE_MULTIPLIER
    if analytic_gaussian_delta(target_epsilon, hi) > delta:
        raise ValueError("target epsilon unreachable below the maximal noise multiplier")
    if analytic_gaussian_delta(target_epsilon, lo) <= delta:
        return lo
    for _ in range(200):  # log-bisection: ~50 halvings from [1e-2, 1e4] to 1e-9
        if hi / lo - 1.0 <= ANALYTIC_RTOL:
            break
        mid = math.sqrt(lo * hi)
        if analytic_gaussian_delta(target_epsilon, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=1024)
def calibrate_gaussian_sigma(target_epsilon: float, delta: float,
                             discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """The smallest noise multiplier σ/Δ whose one-shot Gaussian release is
    (``target_epsilon``, ``delta``)-DP, and whose reported figure (:func:`gaussian_epsilon`
    at :func:`gaussian_discretization` of the target: ``dp_accounting``'s pessimistic PLD)
    does not exceed the target either.

    The exact σ comes from the analytic Gaussian mechanism (:func:`analytic_gaussian_sigma`,
    bounded time). The PLD's pessimistic discretisation over-reports ε by at most about one
    interval (≤ 1e-3·target), so σ is then raised by 1e-4, 2e-4, 4e-4, ... (relative) until
    the PLD figure meets the target too: a few PLD evaluations of a σ near the answer, each
    milliseconds (issue 14: the former PLD-only bisection started at σ = 1, whose PLD at an
    interval of 1e-6 took seconds, and ran past 15 s at a target of 1e-3).

    Raises:
        ValueError: when even σ = 1e4 does not reach the target, or δ is outside (0, 1).
    """
    sigma = analytic_gaussian_sigma(target_epsilon, delta)
    interval = gaussian_discretization(target_epsilon, discretization)
    step = 1e-4
    for _ in range(_PLD_MARGIN_STEPS):
        if gaussian_epsilon(sigma, delta, interval) <= target_epsilon:
            return sigma
        sigma *= 1.0 + step
        step *= 2.0
        if sigma > MAX_NOISE_MULTIPLIER:
            break
    raise ValueError("target epsilon unreachable below the maximal noise multiplier")
