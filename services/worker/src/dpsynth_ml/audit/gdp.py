"""The f-DP one-run audit against a GDP claim (Mahloujifar, Melis and Chaudhuri,
"Auditing f-Differential Privacy in One Run", arXiv 2410.22235), one-sided guesses.

The (eps, delta) analysis of :mod:`dpsynth_ml.audit.one_run` compares the guesses with
eps-randomised response and pays ``2 m delta`` for delta: on Gaussian mechanisms its bound
stays far below the truth, and more canaries stop helping (docs/privacy.md). Testing the
claim "the run is mu-GDP" directly uses the whole Gaussian trade-off curve and has no delta
term. The ledger gives a DP-SGD claim's GDP envelope mu* (the smallest mu its PLD profile
implies, ``dpsynth_ledger.accounting.gdp_envelope``); rejecting mu*-GDP rejects the claim.

The test, for k guesses "in" of which v are right among m canaries, at significance tau
(the paper's recursion for a trade-off function f, here f = G_mu, whose inverse blow-up
is ``x -> Phi(Phi^-1(x) - mu)``): start from r = tau v / m and h = tau (k - v) / m; for
i = v - 1 down to 0, h' = max(h, Phi(Phi^-1(r) - mu)), stop if h' = h, else
r <- min(1, r + i / (k - i) (h' - h)), h <- h'. The claim is rejected when r + h > k / m.
The bound is the largest mu it rejects. A claim that holds only up to an additive
``tail_delta`` (the envelope's) is tested at significance - 2 m tail_delta.

Candidates (k = 0.1, 0.2, 0.5, 1, 2, 5 and 10 % of m, "in" only) are fixed by m before the
run and the best is taken with a Bonferroni correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from dpsynth_shared.gdp import gdp_epsilon
from scipy import optimize
from scipy.special import ndtr, ndtri

from dpsynth_ml.audit.one_run import checked_scores

GUESS_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_MU_CEILING = 40.0


def rejects(mu: float, m: int, guesses: int, correct: int, significance: float) -> float:
    """Positive when ``correct`` right "in" guesses of ``guesses`` reject mu-GDP at
    ``significance``; the paper's objective r + h - k / m."""
    if not 0 <= correct <= guesses <= m or guesses == 0:
        raise ValueError(f"need 0 <= v <= k <= m and k > 0, got v={correct}, k={guesses}, "
                         f"m={m}")
    r = significance * correct / m
    h = significance * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        h_next = max(h, float(ndtr(ndtri(min(r, 1.0)) - mu)))
        if h_next == h:
            break
        r = min(r + (i / (guesses - i)) * (h_next - h), 1.0)
        h = h_next
    return r + h - guesses / m


def mu_lower_bound(m: int, guesses: int, correct: int, *, significance: float) -> float:
    """The largest mu whose GDP claim the counts reject (0 when none is)."""
    floor = 1e-9
    if rejects(floor, m, guesses, correct, significance) <= 0:
        return 0.0
    high = 1.0
    while rejects(high, m, guesses, correct, significance) > 0:
        if high >= _MU_CEILING:
            return _MU_CEILING
        high = min(2 * high, _MU_CEILING)
    return float(optimize.brentq(lambda mu: rejects(mu, m, guesses, correct, significance),
                                 floor, high, xtol=1e-10))


def default_guess_counts(m: int) -> list[int]:
    """The pre-registered numbers of "in" guesses for m canaries."""
    counts: list[int] = []
    for fraction in GUESS_FRACTIONS:
        k = max(1, round(fraction * m))
        if k <= m and k not in counts:
            counts.append(k)
    return counts


@dataclass(frozen=True)
class GdpAuditBound:
    """An f-DP one-run audit against a GDP claim.

    Attributes:
        mu_lower_bound: with probability >= ``confidence`` the run is not mu-GDP for any
            mu below this.
        epsilon_lower_bound: the same at ``delta``, as an epsilon (mu-GDP's eps(delta)).
        claimed_mu: the claim's GDP envelope mu* (None: no claim tested).
        rejected: the bound exceeds the claim: the run is NOT what its accountant says
            (at ``confidence``).
        confidence, delta, canaries, guesses, correct, candidates: as in ``AuditBound``.
        tail_delta: the additive delta of the claim, charged as 2 m tail_delta.
        max_certifiable_mu: the largest mu bound these m, confidence and candidates could
            give at all (every guess of the best candidate right): a claim whose envelope
            is above it cannot be rejected by this audit, however broken the run.
    """

    mu_lower_bound: float
    epsilon_lower_bound: float
    claimed_mu: float | None
    rejected: bool
    confidence: float
    delta: float
    canaries: int
    guesses: int
    correct: int
    candidates: int
    tail_delta: float
    max_certifiable_mu: float


def audit_gdp(scores: np.ndarray, included: np.ndarray, *, confidence: float, delta: float,
              claimed_mu: float | None = None, tail_delta: float = 0.0,
              guess_counts: Sequence[int] | None = None) -> GdpAuditBound:
    """The GDP lower bound from each canary's score and coin flip.

    Raises:
        ValueError: on mismatched or empty inputs, a confidence outside (0, 1), a tail
            delta that leaves no significance, or an impossible guess count.
    """
    scores, included = checked_scores(scores, included, confidence)
    m = int(scores.size)
    counts = list(guess_counts) if guess_counts is not None else default_guess_counts(m)
    if any(not 1 <= k <= m for k in counts):
        raise ValueError("each candidate needs 1 <= k <= m guesses")
    significance = (1.0 - confidence - 2.0 * m * tail_delta) / len(counts)
    if not significance > 0:
        raise ValueError("the claim's tail delta leaves no significance at this m")
    flips = included[np.argsort(-scores, kind="stable")]
    best_mu, best_k, best_v = 0.0, counts[0], int(flips[:counts[0]].sum())
    for k in counts:
        v = int(flips[:k].sum())
        mu = mu_lower_bound(m, k, v, significance=significance)
        if mu > best_mu:
            best_mu, best_k, best_v = mu, k, v
    return GdpAuditBound(
        mu_lower_bound=best_mu, epsilon_lower_bound=gdp_epsilon(best_mu, delta),
        claimed_mu=claimed_mu, rejected=claimed_mu is not None and best_mu > claimed_mu,
        confidence=confidence, delta=delta, canaries=m, guesses=best_k, correct=best_v,
        candidates=len(counts), tail_delta=tail_delta,
        max_certifiable_mu=max_certifiable_mu(m, significance, tuple(counts)))


@lru_cache(maxsize=64)
def max_certifiable_mu(m: int, significance: float, counts: tuple[int, ...]) -> float:
    """The largest mu bound ``counts`` (each tested at ``significance``) can give for m
    canaries: every guess right."""
    return max(mu_lower_bound(m, k, k, significance=significance) for k in counts)
