"""GDP closed forms (dpsynth_shared.gdp) and the GDP envelope of a DP-SGD claim
(dpsynth_ledger.accounting.gdp_envelope), the claim the f-DP one-run audit tests (issue 19).

The closed forms are checked against dp_accounting's analytic Gaussian mechanism (a second
implementation); the envelope must never be below the claim (validity: a correct run must
not be rejected) and, where the claim is itself Gaussian (full batch), must be it.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope, gdp_deltas
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier
from dpsynth_shared.gdp import gdp_delta, gdp_epsilon, gdp_mu

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("eps", "delta"), [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-6),
                                            (8.0, 1e-5), (0.1, 1e-3)])
def test_gdp_matches_the_analytic_gaussian_mechanism(eps: float, delta: float) -> None:
    # a Gaussian mechanism of sensitivity 1 and noise sigma is (1/sigma)-GDP
    sigma = dp_accounting.get_sigma_gaussian(eps, delta)
    assert gdp_mu(eps, delta) == pytest.approx(1 / sigma, rel=1e-8)
    assert gdp_epsilon(1 / sigma, delta) == pytest.approx(eps, abs=1e-8)
    assert gdp_delta(1 / sigma, eps) == pytest.approx(delta, rel=1e-6)
    grid = np.linspace(0, 3 * eps, 7)
    np.testing.assert_allclose(gdp_deltas(1 / sigma, grid),
                               [gdp_delta(1 / sigma, float(e)) for e in grid], rtol=1e-9,
                               atol=1e-15)


def test_gdp_edges() -> None:
    assert gdp_delta(0.0, 1.0) == 0.0
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert gdp_delta(1.0, 0.0) == pytest.approx(2 * 0.5 * math.erfc(-0.5 / math.sqrt(2)) - 1)
    with pytest.raises(ValueError):
        gdp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError):
        gdp_mu(-1.0, 1e-5)


@pytest.mark.parametrize(("sigma", "steps"), [(7.0, 1), (2.0, 4), (1.0, 1)])
def test_the_full_batch_envelope_is_the_gaussian_itself(sigma: float, steps: int) -> None:
    # T full-batch Gaussian steps are exactly (sqrt(T)/sigma)-GDP
    envelope = dp_sgd_gdp_envelope(sigma, 1.0, steps)
    exact = math.sqrt(steps) / sigma
    assert exact <= envelope.mu <= exact * 1.02
    assert envelope.tail_delta <= 1e-10


@pytest.mark.parametrize(("eps", "q", "steps"), [(0.5, 0.1, 50), (1.0, 0.1, 50),
                                                 (2.0, 0.01, 1000), (8.0, 0.25, 20)])
def test_a_subsampled_claim_lies_under_its_envelope(eps: float, q: float, steps: int) -> None:
    sigma = calibrate_noise_multiplier(eps, q, steps, 1e-5)
    envelope = dp_sgd_gdp_envelope(sigma, q, steps)
    # the claim's own profile (dp_accounting's pessimistic PLD) is under mu*-GDP's at every
    # eps, read on a grid independent of the envelope's, down to its tail delta
    claim = pld_lib.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4,
                                            sampling_prob=q).self_compose(steps)
    grid = np.sort(np.random.default_rng(0).uniform(0, 4 * eps + 2, 400))
    deltas = np.asarray(claim.get_delta_for_epsilon(grid))
    gaussian = gdp_deltas(envelope.mu, grid)
    assert np.all(gaussian + envelope.tail_delta >= deltas)
    # and it is not much weaker than the Gaussian through the claim's own (eps, delta)
    matched = gdp_mu(eps, 1e-5)
    assert matched <= envelope.mu <= 1.3 * matched
