"""The f-DP one-run audit against a GDP claim (dpsynth_ml.audit.gdp; issue 19).

Checked against an independent implementation (jax_privacy 2.0.0's ``_epsilon_one_run_fdp``,
loaded by path as in test_one_run_audit.py; skipped when absent), then what the bound
promises: on a mechanism that is exactly mu-GDP it stays at or below mu in at least 95 % of
runs, so a correct run is not reported as breaking its claim.
"""

from __future__ import annotations

import numpy as np
import pytest
from dpsynth_ml.audit.gdp import audit_gdp, default_guess_counts, mu_lower_bound, rejects
from dpsynth_shared.gdp import gdp_epsilon

from .test_one_run_audit import _jax_privacy_auditing, requires_reference

pytestmark = pytest.mark.unit


@requires_reference
@pytest.mark.parametrize(("m", "k", "v"), [(1000, 100, 90), (10_000, 100, 95),
                                           (10_000, 1000, 700), (100_000, 100, 99),
                                           (1000, 10, 10), (5000, 50, 30)])
def test_the_bound_is_jax_privacys(m: int, k: int, v: int) -> None:
    ref = _jax_privacy_auditing()
    mu = mu_lower_bound(m, k, v, significance=0.05)
    theirs = ref._epsilon_one_run_fdp(0.0, m, k, v, 0.05, 1e-5)
    ours = gdp_epsilon(mu, 1e-5) if mu > 0 else 0.0
    assert ours == pytest.approx(theirs, abs=1e-5)


def test_the_objective_falls_with_mu_and_chance_rejects_nothing() -> None:
    values = [rejects(mu, 10_000, 1000, 800, 0.05) for mu in (0.1, 0.5, 1.0, 2.0, 4.0)]
    assert values == sorted(values, reverse=True)
    assert mu_lower_bound(10_000, 1000, 500, significance=0.05) == 0.0
    with pytest.raises(ValueError):
        rejects(1.0, 10, 11, 3, 0.05)


def _runs(mu_true: float, claimed: float, runs: int, m: int = 2000) -> list[bool]:
    rng = np.random.default_rng(11)
    verdicts = []
    for _ in range(runs):
        included = rng.random(m) < 0.5
        scores = mu_true * included + rng.standard_normal(m)  # exactly mu_true-GDP per canary
        result = audit_gdp(scores, included, confidence=0.95, delta=1e-5, claimed_mu=claimed)
        verdicts.append(result.rejected)
    return verdicts


def test_an_exactly_gdp_mechanism_is_not_reported_as_breaking_its_claim() -> None:
    assert sum(_runs(1.0, claimed=1.0, runs=40)) <= 2  # at most 5 %; expected ~0
    # and a mechanism three times less private than claimed is caught
    assert all(_runs(3.0, claimed=1.0, runs=5))


def test_the_result_carries_its_terms_and_refuses_bad_inputs() -> None:
    rng = np.random.default_rng(12)
    included = rng.random(1000) < 0.5
    scores = included + 0.1 * rng.standard_normal(1000)
    result = audit_gdp(scores, included, confidence=0.95, delta=1e-5)
    assert result.claimed_mu is None and not result.rejected
    assert result.candidates == len(default_guess_counts(1000)) == 7
    # a perfect attack on 1,000 canaries: about mu 1 (eps 4.3 at delta 1e-5), no more
    assert result.correct == result.guesses and 0.9 < result.mu_lower_bound < 1.1
    assert result.mu_lower_bound == pytest.approx(result.max_certifiable_mu, rel=1e-6)
    assert result.epsilon_lower_bound == pytest.approx(gdp_epsilon(result.mu_lower_bound,
                                                                   1e-5))
    # a claim's tail delta is charged against the significance: a smaller bound
    tailed = audit_gdp(scores, included, confidence=0.95, delta=1e-5, tail_delta=1e-6)
    assert tailed.mu_lower_bound < result.mu_lower_bound
    assert audit_gdp(scores, included, confidence=0.95, delta=1e-5, claimed_mu=0.5).rejected
    with pytest.raises(ValueError, match="significance"):
        audit_gdp(np.zeros(1000), included, confidence=0.95, delta=1e-5, tail_delta=1e-4)
    with pytest.raises(ValueError, match="same non-zero length"):
        audit_gdp(np.zeros(3), np.zeros(2, dtype=bool), confidence=0.95, delta=1e-5)
