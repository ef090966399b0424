"""The one-run audit's bound (issue 19): Steinke, Nasr and Jagielski (NeurIPS 2023).

Checked three ways: against closed forms (delta = 0 with every guess correct), against a
line-by-line transcription of the paper's ``p_value_DP_audit`` (with its delta term) and
against an independent implementation, jax_privacy 2.0.0's ``_one_run_p_value`` /
``_epsilon_one_run`` (installed with ``--no-deps --target <venv>/jax-privacy-ref`` by the
Makefile's venv step and loaded by path: the package itself would pull JAX; skipped when
absent). Then what the bound promises: on mechanisms whose epsilon is known exactly
(randomised response, the Gaussian mechanism) it stays below that epsilon in at least the
stated share of runs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from dpsynth_ml.audit.one_run import (
    audit,
    default_guess_counts,
    epsilon_lower_bound,
    max_certifiable_epsilon,
    p_value,
)
from scipy.stats import binom, norm

pytestmark = pytest.mark.unit

REFERENCE_DIR = Path(os.environ.get("DPSYNTH_JAX_PRIVACY_REF",
                                    Path(sys.prefix) / "jax-privacy-ref"))
REFERENCE = REFERENCE_DIR / "jax_privacy" / "auditing.py"


def _jax_privacy_auditing() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jax_privacy_auditing_reference", REFERENCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


requires_reference = pytest.mark.skipif(
    not REFERENCE.is_file(),
    reason=f"jax_privacy 2.0.0 is not installed in {REFERENCE_DIR} (pip install "
           "--no-deps --target <that folder> jax_privacy==2.0.0; the Makefile's venv step "
           "does it)")


def _paper_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The paper's ``p_value_DP_audit`` (its appendix), transcribed loop for loop."""
    q = 1 / (1 + math.exp(-eps))
    beta = binom.sf(v - 1, r, q)
    alpha = 0.0
    total = 0.0
    for i in range(1, v + 1):
        total = total + binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return float(min(beta + alpha * delta * 2 * m, 1))


def test_every_guess_right_without_delta_is_the_closed_form() -> None:
    # delta = 0, v = r: p = q^r, so the bound is logit(significance^(1/r))
    for r, significance in ((1000, 0.05), (100, 0.05), (1000, 0.01), (10, 0.05)):
        q = significance ** (1 / r)
        expected = math.log(q / (1 - q))
        assert epsilon_lower_bound(r, r, r, significance=significance, delta=0) == \
            pytest.approx(expected, abs=1e-8)
    # the "1,000 canaries at 95 % top out near eps 5.8"
    assert epsilon_lower_bound(1000, 1000, 1000, significance=0.05, delta=0) == \
        pytest.approx(5.809, abs=1e-3)


@pytest.mark.parametrize(("m", "r", "v"), [(1000, 100, 80), (1000, 200, 150), (200, 20, 20),
                                           (5000, 500, 300), (1000, 1000, 700)])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_p_value_is_the_papers(m: int, r: int, v: int, eps: float, delta: float) -> None:
    assert p_value(m, r, v, eps, delta) == pytest.approx(
        _paper_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-14)


@requires_reference
def test_p_value_and_bound_match_jax_privacy() -> None:
    ref = _jax_privacy_auditing()
    rng = np.random.default_rng(0)
    for _ in range(60):
        m = int(rng.integers(20, 5000))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        eps = float(rng.uniform(0, 4))
        delta = float(rng.choice([0.0, 1e-6, 1e-5, 1e-3]))
        assert p_value(m, r, v, eps, delta) == pytest.approx(
            ref._one_run_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-14)
    for m, r, v, delta in ((1000, 100, 90, 1e-5), (1000, 200, 170, 0.0), (5000, 100, 100, 1e-5),
                           (1000, 1000, 650, 1e-5), (10_000, 1000, 900, 1e-6)):
        ours = epsilon_lower_bound(m, r, v, significance=0.05, delta=delta)
        theirs = ref._epsilon_one_run(0.0, m, r, v, 0.05, delta)
        assert ours == pytest.approx(theirs, abs=2e-6), (m, r, v, delta)
        assert ours > 0.5


def test_the_bound_is_where_the_p_value_crosses_the_significance() -> None:
    m, r, v, delta, significance = 1000, 200, 160, 1e-5, 0.05
    eps = epsilon_lower_bound(m, r, v, significance=significance, delta=delta)
    assert p_value(m, r, v, eps - 1e-6, delta) < significance <= p_value(m, r, v, eps + 1e-6,
                                                                          delta)
    # the delta term only makes claims harder to reject
    assert eps <= epsilon_lower_bound(m, r, v, significance=significance, delta=0.0)
    # chance-level guessing rejects nothing
    assert epsilon_lower_bound(m, r, r // 2, significance=significance, delta=delta) == 0.0


def test_candidates_are_fixed_by_m_and_bonferroni_costs_what_it_should() -> None:
    counts = default_guess_counts(1000)
    assert counts == default_guess_counts(1000)
    assert (500, 500) in counts and (10, 0) in counts
    assert all(1 <= a + b <= 1000 for a, b in counts)
    assert default_guess_counts(1)  # never empty
    perfect = max_certifiable_epsilon(1000, confidence=0.95, delta=0.0)
    # the best candidate guesses all 1,000, tested at 0.05 / (number of candidates)
    assert perfect == pytest.approx(epsilon_lower_bound(
        1000, 1000, 1000, significance=0.05 / len(counts), delta=0.0), abs=1e-9)
    assert 5.0 < perfect < 5.809
    assert max_certifiable_epsilon(1000, confidence=0.95, delta=1e-5) < perfect


def test_a_perfect_attack_reaches_the_ceiling_and_a_blind_one_reaches_nothing() -> None:
    rng = np.random.default_rng(1)
    # exactly half in, so that even the candidate guessing all 1,000 can be right on each
    included = rng.permutation(np.arange(1000) < 500)
    perfect = audit(included.astype(float), included, confidence=0.95, delta=1e-5)
    assert perfect.correct == perfect.guesses == 1000
    assert perfect.epsilon_lower_bound == pytest.approx(perfect.max_certifiable, abs=1e-9)
    blind = audit(rng.random(1000), included, confidence=0.95, delta=1e-5)
    assert blind.epsilon_lower_bound < 0.5
    assert blind.max_certifiable == perfect.max_certifiable


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="same non-zero length"):
        audit(np.zeros(3), np.zeros(4, dtype=bool), confidence=0.95, delta=0)
    with pytest.raises(ValueError, match="finite"):
        audit(np.array([0.0, np.nan]), np.array([True, False]), confidence=0.95, delta=0)
    with pytest.raises(ValueError, match="confidence"):
        audit(np.zeros(3), np.zeros(3, dtype=bool), confidence=1.0, delta=0)
    with pytest.raises(ValueError, match="guesses"):
        audit(np.zeros(3), np.zeros(3, dtype=bool), confidence=0.95, delta=0,
              guess_counts=[(3, 1)])
    with pytest.raises(ValueError, match="v <= r <= m"):
        p_value(10, 11, 3, 1.0, 0.0)


def _share_above(eps: float, runs: int, scores_of: object) -> float:
    rng = np.random.default_rng(2)
    above = 0
    for _ in range(runs):
        included = rng.random(1000) < 0.5
        scores = scores_of(included, rng)  # type: ignore[operator]
        above += audit(scores, included, confidence=0.95,
                       delta=1e-5).epsilon_lower_bound > eps
    return above / runs


def test_on_randomised_response_the_bound_holds() -> None:
    # exactly eps-DP for each canary: the score reports its coin truthfully w.p. e^eps/(1+e^eps)
    eps = 1.0
    keep = math.exp(eps) / (1 + math.exp(eps))

    def scores(included: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        truthful = rng.random(included.size) < keep
        return np.where(truthful, included, ~included).astype(float) + 1e-3 * rng.random(
            included.size)

    assert _share_above(eps, 60, scores) <= 0.05


def test_on_the_gaussian_mechanism_the_bound_holds() -> None:
    # sensitivity 1, noise sigma: (eps, 1e-5)-DP by the analytic Gaussian mechanism
    # (Balle & Wang 2018): delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)
    sigma = 1.0

    def delta_of(eps: float) -> float:
        return float(norm.cdf(0.5 / sigma - eps * sigma)
                     - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma))

    lo, hi = 0.0, 20.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > 1e-5 else (lo, mid)
    eps = hi  # ~4.4

    def scores(included: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return included + sigma * rng.standard_normal(included.size)

    assert _share_above(eps, 40, scores) == 0.0
    # and the audit sees something: a clear positive bound, well below the truth (one-run
    # bounds are loose; docs/privacy.md)
    rng = np.random.default_rng(3)
    included = rng.random(1000) < 0.5
    bound = audit(scores(included, rng), included, confidence=0.95, delta=1e-5)
    assert 0.5 < bound.epsilon_lower_bound < eps
