"""The GDP envelope of a DP-SGD claim: the smallest mu such that the claimed run, if it is
what the accountant says, is mu-GDP (up to a stated tail delta).

The f-DP one-run audit (docs/privacy.md, "Empirical audits"; ``dpsynth_ml.audit.gdp``)
tests a claim of the form "the mechanism is mu-GDP". The ledger's claim for a DP-SGD run
(sigma, q, steps) is its PLD: an (eps, delta(eps)) profile for every eps >= 0, both
directions of the add/remove pair. A trade-off curve is fixed by its profile, and a larger
delta at every eps means a less private curve, so if mu-GDP's profile is at least the
claim's everywhere (Dong, Roth and Su 2022, Corollary 2.13 for GDP's profile) then the
claim implies mu-GDP, and rejecting mu-GDP rejects the claim. The envelope is the smallest
such mu.

How it is made sure (each step errs towards a larger mu, i.e. a weaker claim to reject):

* the claim's profile is dp_accounting's pessimistic PLD (the ledger's, at a finer
  discretisation), so it is at least the true profile;
* the profile is read on a grid eps_0 = 0 < eps_1 < ... < eps_n; both profiles decrease, so
  requiring ``gdp_delta(mu, eps_{i+1}) >= delta_claim(eps_i)`` at every i covers every eps
  in between;
* beyond eps_n the claim's delta is below ``tail_delta`` (1e-10 where reachable): the
  claim is then mu-GDP up to that additive delta, which the audit charges against its
  significance (2 m tail_delta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.special import log_ndtr, ndtr

#: the claim's profile is read every GRID_STEP in eps
GRID_STEP = 0.001
#: the profile is read out to where the claim's delta falls below this (or MAX_EPS)
TAIL_DELTA = 1e-10
MAX_EPS = 60.0
#: finer than the ledger's 1e-3: the envelope is tested at a few parts in a thousand
DISCRETIZATION = 1e-4


@dataclass(frozen=True)
class GdpEnvelope:
    """mu: the smallest mu with the claim's profile under mu-GDP's on the grid;
    tail_delta: the claim's delta at the grid's end (the additive part)."""

    mu: float
    tail_delta: float


def gdp_deltas(mu: float, eps: np.ndarray) -> np.ndarray:
    """mu-GDP's delta at each eps (vectorised ``dpsynth_shared.gdp.gdp_delta``)."""
    upper = ndtr(-eps / mu + mu / 2)
    lower = np.exp(eps + log_ndtr(-eps / mu - mu / 2))
    deltas: np.ndarray = np.clip(upper - lower, 0.0, None)
    return deltas


@lru_cache(maxsize=256)
def dp_sgd_gdp_envelope(noise_multiplier: float, sample_rate: float, steps: int,
                        ) -> GdpEnvelope:
    """The GDP envelope of ``steps`` Poisson-subsampled Gaussian steps (add/remove).

    Raises:
        ValueError: on a non-positive sigma, a rate outside (0, 1] or steps < 1.
    """
    if not noise_multiplier > 0 or not 0 < sample_rate <= 1 or steps < 1:
        raise ValueError("need sigma > 0, 0 < q <= 1 and steps >= 1")
    pld = pld_lib.from_gaussian_mechanism(
        noise_multiplier, value_discretization_interval=DISCRETIZATION,
        sampling_prob=sample_rate).self_compose(steps)
    # the grid ends where the claim's delta first falls to TAIL_DELTA (bisection)
    low_end, end = 0.0, GRID_STEP
    while end < MAX_EPS and pld.get_delta_for_epsilon(end) > TAIL_DELTA:
        low_end, end = end, min(2 * end, MAX_EPS)
    while end - low_end > GRID_STEP:
        mid = (low_end + end) / 2
        if pld.get_delta_for_epsilon(mid) > TAIL_DELTA:
            low_end = mid
        else:
            end = mid
    grid = np.arange(0.0, end + GRID_STEP, GRID_STEP)
    claim = np.asarray(pld.get_delta_for_epsilon(grid), dtype=np.float64)
    tail = float(claim[-1])

    def covers(mu: float) -> bool:
        return bool(np.all(gdp_deltas(mu, grid[1:]) >= claim[:-1]))

    low, high = 0.0, 1.0
    while not covers(high):
        low, high = high, 2 * high
        if high > 1e4:
            raise ValueError("no GDP envelope below mu 1e4")
    while high - low > 1e-9 * max(high, 1.0):
        mid = (low + high) / 2
        if covers(mid):
            high = mid
        else:
            low = mid
    return GdpEnvelope(mu=high, tail_delta=tail if math.isfinite(tail) else 1.0)
