"""Rényi-DP bookkeeping at one integer order: the maths of the ledger's privacy filter.

Amounts are rounded *up* after every arithmetic operation (``math.nextafter(x, inf)``), so a
stored accumulator is never below the exact sum of what it counts (W3C attribution API PR #309;
OpenDP's ``inf_add``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import mpmath
import numpy as np
from dpsynth_shared.dp_events import (
    DpEvent,
    DpSgdEvent,
    GaussianEvent,
    Neighbouring,
    ParallelEvent,
)

MIN_ORDER = 2
MAX_ORDER = 256
CONVERSION_NAME = "rdp->dp: Canonne-Kamath-Steinke 2020 Prop. 12 / Balle et al. 2020 Eq. 20"
"""The one RDP→(ε, δ) conversion used for the filter (the one ``dp_accounting``'s
``RdpAccountant.get_epsilon`` applies, ``rdp_privacy_accountant.compute_epsilon``)."""

_INF = math.inf
_CONVERSION_ROUNDING = 8 * 2.0**-53
"""A bound on the relative error of the conversion's few float roundings (of its terms)."""


def up(x: float) -> float:
    """The next float above ``x``: rounds a computed amount upwards (never under-count)."""
    return math.nextafter(x, _INF)


def add_up(a: float, b: float) -> float:
    """``a + b`` rounded upwards: the only way amounts are accumulated."""
    return up(a + b)


def mul_up(steps: int, per_step: float) -> float:
    """``steps * per_step`` rounded upwards (0 for zero steps)."""
    return 0.0 if steps == 0 else up(steps * per_step)


def ceil_float(value: Fraction) -> float:
    """The smallest float ≥ the exact rational ``value``: an exactly known amount, rounded up.

    ``float(Fraction)`` is correctly rounded (to nearest), so at most one step up is needed.
    """
    nearest = float(value)
    return nearest if Fraction(nearest) >= value else up(nearest)


def gaussian_rdp(order: int, sigma: float, sensitivity: float = 1.0) -> float:
    """α·s²/(2σ²) of the given floats, computed exactly and rounded up (Mironov 2017, Prop. 7).

    The float expression ``order * (s/σ)**2 / 2`` rounds three times to nearest and may land
    one or two ulps BELOW the exact value, which one ``up`` does not always repair.
    """
    ratio = Fraction(sensitivity) / Fraction(sigma)
    return ceil_float(Fraction(order) * ratio * ratio / 2)


def sum_up(values: list[float]) -> float:
    """Correctly rounded sum (``math.fsum``) moved one ulp up; order-independent."""
    return 0.0 if not values else up(math.fsum(values))


@lru_cache(maxsize=65536)
def rdp_step(noise_multiplier: float, sample_rate: float, order: int) -> float:
    """RDP at ``order`` of ONE step of the Poisson-subsampled Gaussian mechanism, rounded up.

    Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian
    Mechanism", Sec. 3.3: for an integer order α ≥ 2 and the add/remove relation,

        A_α = Σ_{k=0..α} C(α, k) (1−q)^{α−k} q^k exp((k² − k) / (2σ²)),  RDP = log(A_α)/(α−1).

    Every term is positive (no cancellation), so evaluating the sum with mpmath at 60
    significant digits and taking the smallest float at or above it gives an upper bound
    that is exact to the last bit. (dp_accounting evaluates the same sum in floating point,
    which can land a few 1e-11 relative below the exact value.) For q = 1 it is α / (2σ²),
    computed exactly and rounded up (:func:`gaussian_rdp`).
    """
    if sample_rate == 1.0:
        return gaussian_rdp(order, noise_multiplier)
    if order < 2 or not 0.0 < sample_rate < 1.0 or not noise_multiplier > 0.0:
        raise ValueError("rdp_step needs an integer order >= 2, q in (0, 1] and sigma > 0")
    with mpmath.workdps(60):
        q, sigma = mpmath.mpf(sample_rate), mpmath.mpf(noise_multiplier)
        two_var = 2 * sigma * sigma
        a = mpmath.fsum(mpmath.binomial(order, k) * (1 - q) ** (order - k) * q ** k
                        * mpmath.exp((k * k - k) / two_var) for k in range(order + 1))
        # 60 digits carry an error far below 1e-50 relative; compare against a bound that
        # covers it, so the float returned is >= the true value, not only >= its estimate
        bound = mpmath.log(a) / (order - 1) * (1 + mpmath.mpf(10) ** -50)
        nearest = float(bound)
        return nearest if mpmath.mpf(nearest) >= bound else up(nearest)


GROUP_FACTOR = 3
"""Mironov 2017, Prop. 2 at group distance 2 (c = 1): (2α, ε)-RDP gives (α, 3ε)-RDP."""
GROUP_NAME = ("group privacy at distance 2 (Mironov 2017, \"Renyi Differential Privacy\", "
              "Prop. 2): charge 3 x RDP_add/remove(2 alpha*)")


def group_rdp(rdp_at_double_order: float) -> float:
    """3 × the add/remove RDP at 2α, rounded up: an RDP bound at α for a replace-one pair.

    Mironov 2017, "Rényi Differential Privacy", Prop. 2: if f is (α', ε)-RDP and
    α' ≥ 2^(c+1), then for datasets at distance 2^c, D_{α'/2^c} ≤ 3^c ε. A replace-one pair
    is at add/remove distance 2 (c = 1), so with α' = 2α (≥ 4 for every order α ≥ 2) the
    RDP at α under replace-one is ≤ 3·RDP_add/remove(2α). ``ceil_float`` of the exact
    rational 3·x (x already an upper bound) keeps it an upper bound to the last bit.
    """
    return ceil_float(GROUP_FACTOR * Fraction(rdp_at_double_order))


def by_group(dataset: Neighbouring | str | None, event: Neighbouring | str) -> bool:
    """True when an event analysed under ``event`` enters a ``dataset`` relation through group
    privacy (an add/remove mechanism into a replace-one dataset).

    Raises:
        ValueError: a replace-one mechanism into an add/remove dataset (never admissible:
            group privacy does not run that way; :func:`check_neighbouring` refuses it first).
    """
    if dataset is None or str(dataset) == str(event):
        return False
    if str(dataset) == Neighbouring.REPLACE_ONE:
        return True
    raise ValueError("a replace-one mechanism cannot enter an add/remove dataset")


def charge_step(noise_multiplier: float, sample_rate: float, order: int,
                dataset: Neighbouring | str | None = None) -> float:
    """RDP at ``order`` of ONE DP-SGD step as charged to a dataset of relation ``dataset``.

    DP-SGD (Poisson-subsampled Gaussian) is analysed add/remove (:func:`rdp_step`); on a
    replace-one dataset it enters through group privacy at distance 2:
    ``group_rdp(rdp_step(σ, q, 2·order))`` (Mironov 2017, Prop. 2). ``None`` or
    ``"add_remove"``: the plain add/remove step.
    """
    if by_group(dataset, Neighbouring.ADD_REMOVE):
        if order < MIN_ORDER:
            raise ValueError("group privacy at distance 2 needs an order >= 2")
        return group_rdp(rdp_step(noise_multiplier, sample_rate, 2 * order))
    return rdp_step(noise_multiplier, sample_rate, order)


def rdp_at_order(event: DpEvent, order: int, dataset: Neighbouring | str | None = None) -> float:
    """RDP of ``event`` at one integer ``order``, rounded upwards, as charged to a dataset of
    relation ``dataset`` (``None``: the event's own relation).

    A DP-SGD run is ``steps`` times one step (RDP composes additively, Mironov 2017, Prop. 1);
    a Gaussian of sensitivity ``s`` and std ``σ`` has RDP α s² / (2σ²) (Mironov 2017, Prop. 7);
    a parallel event costs the max over its disjoint partitions. An add/remove event (every
    DP-SGD run: its analysis is add/remove) on a replace-one dataset is charged through group
    privacy at distance 2 (:func:`group_rdp`). A Gaussian recorded under the dataset's own
    relation (the class-size histogram carries the replace-one sensitivity √2) is exact.
    """
    if isinstance(event, DpSgdEvent):
        # the Poisson-subsampled Gaussian's RDP is the add/remove one (Mironov, Talwar &
        # Zhang 2019), whatever relation the event is labelled with: under replace-one it is
        # charged through group privacy (a replace-one label never lowers the charge)
        if dataset is not None:
            by_group(dataset, event.neighbouring)  # refuses replace-one into add/remove
        relation = dataset if dataset is not None else event.neighbouring
        if event.steps == 0:
            return 0.0
        return mul_up(event.steps, charge_step(event.noise_multiplier, event.sample_rate,
                                               order, relation))
    if isinstance(event, GaussianEvent):
        if by_group(dataset, event.neighbouring):
            return group_rdp(gaussian_rdp(2 * order, event.sigma, event.sensitivity))
        return gaussian_rdp(order, event.sigma, event.sensitivity)
    if isinstance(event, ParallelEvent):
        return max((rdp_at_order(sub, order, dataset) for sub in event.partitions.values()),
                   default=0.0)
    raise TypeError(f"unknown event {event!r}")  # pragma: no cover


def rdp_to_epsilon(rdp: float, order: int, delta: float) -> float:
    """Convert an RDP amount at ``order`` into ε at ``delta``: the ledger's named conversion.

    ε = rdp + log1p(−1/α) − (log δ + log α)/(α − 1), floored at 0: Canonne, Kamath & Steinke
    2020, "The Discrete Gaussian for DP", Prop. 12 (arXiv 2004.00010 v4), also Balle et al.
    2020, "Hypothesis testing interpretations and Rényi DP", Eq. 20 (arXiv 2001.05990). It is
    exactly ``dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon`` at one order, including
    its KL shortcut (ε = 0 when δ² + expm1(−rdp) > 0, i.e. δ ≥ sqrt(1 − e^{−KL})), except
    that the result is rounded UP: the float expression rounds to nearest several times and
    lands ~1 ulp below the exact value about half of the time, so a margin of
    ``_CONVERSION_ROUNDING`` times the terms' magnitude is added (≈ 1e-15 relative).
    """
    if rdp < 0:
        raise ValueError("RDP cannot be negative")
    if delta**2 + math.expm1(-rdp) > 0:
        return 0.0
    tail, shift = math.log1p(-1.0 / order), math.log(delta * order) / (order - 1)
    margin = _CONVERSION_ROUNDING * (rdp + abs(tail) + abs(shift))
    return max(0.0, up(rdp + tail - shift + margin))


def epsilon_to_rdp_budget(epsilon: float, order: int, delta: float) -> float:
    """The largest RDP at ``order`` whose :func:`rdp_to_epsilon` is ``epsilon`` (its inverse).

    rdp = ε − log1p(−1/α) + log(δ α)/(α − 1); may be ≤ 0 when ``order`` is useless for
    (ε, δ). Rounded DOWN by the same margin as :func:`rdp_to_epsilon` and one ulp, so that a
    budget never exceeds the limit it stands for.
    """
    tail, shift = math.log1p(-1.0 / order), math.log(delta * order) / (order - 1)
    margin = _CONVERSION_ROUNDING * (abs(epsilon) + abs(tail) + abs(shift))
    return math.nextafter(epsilon - tail + shift - margin, -_INF)


_ORDERS = np.arange(MIN_ORDER, MAX_ORDER + 1, dtype=np.float64)


def _gaussian_eps(rho: float, delta: float) -> tuple[float, int]:
    """min over orders of the conversion for a Gaussian with RDP α·ρ, and the argmin."""
    eps = rho * _ORDERS + np.log1p(-1.0 / _ORDERS) - np.log(delta * _ORDERS) / (_ORDERS - 1)
    idx = int(np.argmin(eps))
    return float(eps[idx]), int(_ORDERS[idx])


@lru_cache(maxsize=1024)
def admission_order(epsilon_limit: float, delta: float) -> int:
    """The dataset's fixed filter order α* (docs/privacy.md), from (ε limit, δ) alone.

    Finds the Gaussian mechanism (RDP α/(2σ²) = α·ρ) whose ε at δ under the named conversion,
    optimised over integer orders in [2, 256], equals the limit (bisection on ρ = 1/(2σ²)),
    and returns the order that attains that minimum.
    """
    lo, hi = 1e-12, 1.0
    while _gaussian_eps(hi, delta)[0] < epsilon_limit:
        hi *= 2.0
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if _gaussian_eps(mid, delta)[0] < epsilon_limit:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1.0 < 1e-12:
            break
    return _gaussian_eps(hi, delta)[1]
