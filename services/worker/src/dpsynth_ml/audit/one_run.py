"""The one-run audit's statistics: Steinke, Nasr and Jagielski, "Privacy Auditing with One
(1) Training Run" (NeurIPS 2023, arXiv 2305.08846).

m canaries are each included in the training run independently with probability 1/2 (the
coin flips S). After the run the auditor scores every canary, guesses "in" for the k+
highest scores and "out" for the k- lowest, and abstains on the rest: r = k+ + k- guesses,
v of them correct. If the run was (eps, delta)-DP for every canary, v is stochastically
dominated as the paper's Theorem 3.1 / Proposition 5.3 says, and the p-value of observing
v or more correct guesses is (the paper's ``p_value_DP_audit``, with its delta term)::

    q     = e^eps / (1 + e^eps)                  # randomised response's accuracy
    beta  = P[Binomial(r, q) >= v]
    alpha = max_{1<=i<=v} P[v > Binomial(r, q) >= v - i] / i
    p     = min(1, beta + 2 m delta alpha)

The audit's lower bound is the largest eps whose claim (eps, delta) is rejected at the given
significance, ``p(eps) < 1 - confidence``: with that confidence the mechanism is NOT
(eps, delta)-DP for a smaller eps. ``p`` grows with eps, so the rejected claims are an
interval [0, eps_lb).

Choosing the guesses after looking at the scores would void the confidence. Here the
candidate guess counts (k+, k-) are fixed before the run (:func:`default_guess_counts`, a
function of m only) and the best of them is taken with a Bonferroni correction: each is
tested at significance / (number of candidates), so the reported bound holds at the stated
confidence whichever candidate wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy.stats import binom

#: the fractions of m guessed "in" (the highest scores) by the pre-registered candidates;
#: each is used one-sided (k- = 0) and two-sided (k- = k+)
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

_EPS_CEILING = 60.0  # e^60 ~ 1e26: beyond what any count of canaries can certify


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P-value of ``v`` correct guesses out of ``r`` (m canaries) if the run is
    (eps, delta)-DP: the paper's ``p_value_DP_audit`` (with its delta term).

    Raises:
        ValueError: unless 0 <= v <= r <= m, eps >= 0 and 0 <= delta <= 1.
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not eps >= 0 or not 0 <= delta <= 1:
        raise ValueError("need eps >= 0 and 0 <= delta <= 1")
    q = 1.0 / (1.0 + math.exp(-eps))
    beta = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    # P[v > Binomial(r, q) >= v - i] for i = 1..v, as a running sum of the pmf
    i = np.arange(1, v + 1)
    within = np.cumsum(binom.pmf(v - i, r, q))
    alpha = float(np.max(within / i))
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, *, significance: float,
                        delta: float) -> float:
    """The largest eps whose (eps, delta) claim ``v`` correct guesses of ``r`` reject at
    ``significance`` (0 when none is rejected). Accurate to ~1e-9 in eps."""
    if not 0 < significance < 1:
        raise ValueError("significance must be in (0, 1)")

    def gap(eps: float) -> float:
        return significance - p_value(m, r, v, eps, delta)

    if gap(0.0) <= 0:
        return 0.0
    high = 1.0
    while gap(high) > 0:
        if high >= _EPS_CEILING:
            return _EPS_CEILING
        high = min(2 * high, _EPS_CEILING)
    return float(optimize.brentq(gap, 0.0, high, xtol=1e-10))


def default_guess_counts(m: int) -> list[tuple[int, int]]:
    """The pre-registered candidates (k+, k-) for m canaries (a function of m only)."""
    counts: list[tuple[int, int]] = []
    for fraction in GUESS_FRACTIONS:
        k = max(1, round(fraction * m))
        for pair in ((k, 0), (k, k)):
            if sum(pair) <= m and pair not in counts:
                counts.append(pair)
    return counts


@dataclass(frozen=True)
class AuditBound:
    """One audit's result.

    Attributes:
        epsilon_lower_bound: with probability >= ``confidence`` the mechanism is not
            (eps, delta)-DP for any eps below this.
        confidence: 1 - significance (before the Bonferroni split over the candidates).
        delta: the delta of the claims tested.
        canaries: m.
        guesses: r of the winning candidate.
        correct: v of the winning candidate.
        guess_in, guess_out: its k+ and k-.
        candidates: how many (k+, k-) were tested (the Bonferroni factor).
        max_certifiable: the largest bound this m, confidence and delta could give at all
            (every guess of the largest candidate correct): a bound near it says "at least
            this much", nothing about how much more.
    """

    epsilon_lower_bound: float
    confidence: float
    delta: float
    canaries: int
    guesses: int
    correct: int
    guess_in: int
    guess_out: int
    candidates: int
    max_certifiable: float


def max_certifiable_epsilon(m: int, *, confidence: float, delta: float,
                            guess_counts: Sequence[tuple[int, int]] | None = None) -> float:
    """The largest lower bound an audit of ``m`` canaries can report at all: every guess of
    its best candidate correct (each candidate at the Bonferroni-split significance)."""
    counts = tuple(guess_counts) if guess_counts is not None else tuple(default_guess_counts(m))
    return _max_certifiable(m, confidence, delta, counts)


@lru_cache(maxsize=64)
def _max_certifiable(m: int, confidence: float, delta: float,
                     counts: tuple[tuple[int, int], ...]) -> float:
    significance = (1.0 - confidence) / len(counts)
    return max(epsilon_lower_bound(m, a + b, a + b, significance=significance, delta=delta)
               for a, b in counts)


def checked_scores(scores: np.ndarray, included: np.ndarray,
                   confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores as float64 and coin flips as bool, 1-D, of one non-zero length, finite, and a
    confidence in (0, 1) (ValueError otherwise): what every audit analysis takes."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.ndim != 1 or scores.shape != included.shape or scores.size == 0:
        raise ValueError("scores and included must be 1-D, of the same non-zero length")
    if not np.all(np.isfinite(scores)):
        raise ValueError("every score must be finite")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    return scores, included


def audit(scores: np.ndarray, included: np.ndarray, *, confidence: float, delta: float,
          guess_counts: Sequence[tuple[int, int]] | None = None) -> AuditBound:
    """The one-run lower bound from each canary's score (higher = more likely "in") and its
    coin flip (``included``, bool), over the pre-registered guess counts.

    Raises:
        ValueError: on mismatched or empty inputs, a confidence outside (0, 1), or a
            candidate with more guesses than canaries.
    """
    scores, included = checked_scores(scores, included, confidence)
    m = int(scores.size)
    counts = list(guess_counts) if guess_counts is not None else default_guess_counts(m)
    if any(a < 0 or b < 0 or a + b == 0 or a + b > m for a, b in counts):
        raise ValueError("each candidate needs 1 <= k+ + k- <= m guesses")
    significance = (1.0 - confidence) / len(counts)
    # a stable order; ties between equal scores are broken by the canary's index, which
    # the coin flips do not depend on
    order = np.argsort(-scores, kind="stable")
    flips = included[order]
    best = (0.0, counts[0], 0)
    for k_in, k_out in counts:
        correct = int(flips[:k_in].sum()) + int((~flips[m - k_out:]).sum() if k_out else 0)
        bound = epsilon_lower_bound(m, k_in + k_out, correct, significance=significance,
                                    delta=delta)
        if bound > best[0] or (best[0] == 0 and (k_in, k_out) == counts[0]):
            best = (bound, (k_in, k_out), correct)
    bound, (k_in, k_out), correct = best
    return AuditBound(epsilon_lower_bound=bound, confidence=confidence, delta=delta,
                      canaries=m, guesses=k_in + k_out, correct=correct, guess_in=k_in,
                      guess_out=k_out, candidates=len(counts),
                      max_certifiable=max_certifiable_epsilon(
                          m, confidence=confidence, delta=delta, guess_counts=counts))
