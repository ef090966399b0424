"""The accountant comparison report of a planned DP-SGD job (issue 20, item 4).

For a target (ε, δ, q, steps) of a Poisson-subsampled Gaussian run (add/remove), the σ
each accountant calibrates, and every σ evaluated by every accountant:

* ``rdp``: Rényi DP (Mironov, Talwar & Zhang 2019) at the integer orders 2..256 the
  ledger's :mod:`~dpsynth_ledger.accounting.rdp` uses, minimised over orders, converted by
  the ledger's one conversion (:data:`~dpsynth_ledger.accounting.rdp.CONVERSION_NAME`). The
  search runs on a float (log-sum-exp) evaluation of the same sum; the reported ε of each σ
  is the ledger's exact, rounded-up :func:`~dpsynth_ledger.accounting.rdp.rdp_step` at the
  order the search found best. An upper bound.
* ``gdp``: μ-GDP by the central limit theorem of Dong, Roth & Su 2022 / Bu et al. 2020,
  μ = q·sqrt(T·(exp(1/σ²) − 1)), δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). An asymptotic
  APPROXIMATION (T → ∞, q·sqrt(T) fixed), not a bound: it can under-report ε, most at few
  steps or a large q. Closed form; calibration inverts it exactly.
* ``pld``: the ledger's tight accountant (:mod:`~dpsynth_ledger.accounting.pld`,
  ``dp_accounting``'s pessimistic PLD) and its own calibration. PRV (opacus / Microsoft's
  ``prv_accountant``) and PLD compute the same privacy-loss distribution, discretised
  differently, so they agree to their discretisation errors.

What the ledger does with them: a job's σ is the PLD σ (the job's standalone target), and
admission charges that σ's RDP at the dataset's fixed order α* to the Feldman–Zrnic filter
(:mod:`~dpsynth_ledger.accounting.filter`), the only figure valid under adaptive
composition; its ε (``filter_epsilon``) is therefore above the target.
Pure: no database, no torch or opacus (the tests compare with opacus).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from dpsynth_shared.accountant_report import AccountantComparison, AccountantName, AccountantRow
from dpsynth_shared.gdp import gdp_epsilon, gdp_mu
from scipy.special import gammaln, logsumexp

from dpsynth_ledger.accounting.pld import (
    DEFAULT_DISCRETIZATION,
    MAX_NOISE_MULTIPLIER,
    calibrate_noise_multiplier,
    dp_sgd_epsilon,
)
from dpsynth_ledger.accounting.rdp import (
    MAX_ORDER,
    MIN_ORDER,
    admission_order,
    mul_up,
    rdp_step,
    rdp_to_epsilon,
)

MIN_NOISE_MULTIPLIER = 0.2
"""No report for a target whose RDP σ is below this: the PLD of a smaller σ grows as 1/σ²
(seconds at 0.2, a memory hazard far below); such a job would be refused by every filter
anyway (its best RDP order is ~2)."""

RDP_RTOL = 1e-6
"""Relative width of the RDP and GDP σ searches (far below opacus' 0.01 in ε)."""

LABELS: dict[AccountantName, str] = {
    "rdp": "Renyi DP, integer orders 2..256, ledger conversion (upper bound)",
    "gdp": "Gaussian DP by the central limit theorem (approximation, not a bound)",
    "pld": "privacy loss distribution, dp_accounting, pessimistic (tight upper bound; "
           "PRV computes the same distribution)",
}
NOTES: dict[AccountantName, str] = {
    "rdp": "RDP's conversion to (eps, delta) is lossy: its sigma is the largest of the three.",
    "gdp": "mu = q*sqrt(T*(exp(1/sigma^2)-1)) is the CLT limit (Dong, Roth & Su 2022; Bu et "
           "al. 2020); an approximation that can under-report epsilon, so never charged.",
    "pld": "The ledger's calibration. PRV (opacus / Microsoft prv_accountant) and PLD "
           "(dp_accounting) compute the same privacy-loss distribution with different "
           "discretisations; they agree to about their error tolerances.",
}

_ORDERS = np.arange(MIN_ORDER, MAX_ORDER + 1)
_K = np.arange(MAX_ORDER + 1)
_LOG_BINOM = np.where(
    _K[None, :] <= _ORDERS[:, None],
    gammaln(_ORDERS[:, None] + 1.0) - gammaln(_K[None, :] + 1.0)
    - gammaln(np.maximum(_ORDERS[:, None] - _K[None, :], 0) + 1.0),
    -np.inf)


def rdp_curve(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """One step's RDP at every order 2..256 (float log-sum-exp of
    :func:`~dpsynth_ledger.accounting.rdp.rdp_step`'s sum; a search aid, not a charge)."""
    orders = _ORDERS.astype(np.float64)
    if sample_rate >= 1.0:
        full: np.ndarray = orders / (2.0 * noise_multiplier**2)
        return full
    k = _K.astype(np.float64)
    terms = (_LOG_BINOM + (orders[:, None] - k[None, :]) * math.log1p(-sample_rate)
             + k[None, :] * math.log(sample_rate)
             + (k * k - k)[None, :] / (2.0 * noise_multiplier**2))
    curve: np.ndarray = logsumexp(terms, axis=1) / (orders - 1.0)
    return curve


def _rdp_epsilons(noise_multiplier: float, sample_rate: float, steps: int,
                  delta: float) -> np.ndarray:
    """ε at δ of every order's RDP bound (the ledger's conversion, vectorised)."""
    orders = _ORDERS.astype(np.float64)
    rdp = steps * rdp_curve(noise_multiplier, sample_rate)
    eps: np.ndarray = rdp + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1)
    floored: np.ndarray = np.maximum(eps, 0.0)
    return floored


def rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int,
                delta: float) -> float:
    """RDP ε of a run, optimised over integer orders: the exact, rounded-up
    :func:`~dpsynth_ledger.accounting.rdp.rdp_step` at the order the float curve finds
    best, converted by :func:`~dpsynth_ledger.accounting.rdp.rdp_to_epsilon`."""
    order = int(_ORDERS[int(np.argmin(_rdp_epsilons(noise_multiplier, sample_rate, steps,
                                                     delta)))])
    return filter_epsilon(noise_multiplier, sample_rate, steps, delta, order)


def filter_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                   order: int) -> float:
    """The ε the filter's conversion gives the run's RDP at one ``order`` (exact sum,
    rounded up, as admission charges it)."""
    rdp = mul_up(steps, rdp_step(noise_multiplier, sample_rate, order))
    return rdp_to_epsilon(rdp, order, delta)


def gdp_mu_of(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """μ of the CLT: q·sqrt(T·(exp(1/σ²) − 1))."""
    return sample_rate * math.sqrt(steps * math.expm1(noise_multiplier**-2))


def gdp_epsilon_of(noise_multiplier: float, sample_rate: float, steps: int,
                   delta: float) -> float:
    """ε at δ of the CLT's μ-GDP (an approximation)."""
    return gdp_epsilon(gdp_mu_of(noise_multiplier, sample_rate, steps), delta)


def gdp_sigma(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """σ whose CLT μ is the μ-GDP through (ε, δ): the closed-form inverse of
    :func:`gdp_mu_of`, σ = 1 / sqrt(log1p(μ² / (q² T)))."""
    mu = gdp_mu(target_epsilon, delta)
    return 1.0 / math.sqrt(math.log1p(mu * mu / (sample_rate * sample_rate * steps)))


def _search(eps_of: Callable[[float], float], target: float) -> float:
    """The smallest σ (upper end, relative :data:`RDP_RTOL`) with ``eps_of(σ) ≤ target``."""
    lo, hi = 1e-2, 1.0
    while eps_of(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > MAX_NOISE_MULTIPLIER:
            raise ValueError("target epsilon unreachable below the maximal noise multiplier")
    if eps_of(lo) <= target:
        return lo
    while hi / lo - 1.0 > RDP_RTOL:
        mid = math.sqrt(lo * hi)
        if eps_of(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


@lru_cache(maxsize=1024)
def rdp_sigma(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest σ whose RDP ε (min over orders 2..256) is at most the target.

    The search uses the float curve; the ε reported for it (:func:`rdp_epsilon`) is the
    exact sum's, which differs from the float one by ~1e-12 relative.
    """
    return _search(lambda s: float(np.min(_rdp_epsilons(s, sample_rate, steps, delta))),
                   target_epsilon)


def compare_accountants(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                        *, epsilon_limit: float | None = None,
                        discretization: float = DEFAULT_DISCRETIZATION,
                        pld_sigma: Callable[[], float] | None = None,
                        ) -> AccountantComparison:
    """The report for one planned job (add/remove, Poisson sampling).

    Args:
        target_epsilon, delta, sample_rate, steps: the planned job.
        epsilon_limit: the dataset's ε limit fixing the filter order α* (default: the
            target).
        discretization: the PLD interval (the ledger's).
        pld_sigma: how to get the PLD σ (the ledger passes its cached, slotted calibration);
            default :func:`~dpsynth_ledger.accounting.pld.calibrate_noise_multiplier`.

    Raises:
        ValueError: when a target is unreachable below σ = 1e4, or on bad inputs.
    """
    if not (target_epsilon > 0 and 0 < delta < 1 and 0 < sample_rate <= 1 and steps >= 1):
        raise ValueError("need epsilon > 0, 0 < delta < 1, 0 < q <= 1 and steps >= 1")
    sigma_rdp = rdp_sigma(target_epsilon, delta, sample_rate, steps)
    if sigma_rdp < MIN_NOISE_MULTIPLIER:
        raise ValueError(f"the target needs sigma {sigma_rdp:.3g} by RDP, below the report's "
                         f"floor {MIN_NOISE_MULTIPLIER:g}: a larger target epsilon is "
                         "not reported")
    sigmas: dict[AccountantName, float] = {
        "rdp": sigma_rdp,
        "gdp": gdp_sigma(target_epsilon, delta, sample_rate, steps),
        "pld": (pld_sigma() if pld_sigma is not None else calibrate_noise_multiplier(
            target_epsilon, sample_rate, steps, delta, discretization)),
    }
    limit = epsilon_limit if epsilon_limit is not None else target_epsilon
    order = admission_order(limit, delta)
    evaluate: dict[AccountantName, Callable[[float], float]] = {
        "rdp": lambda s: rdp_epsilon(s, sample_rate, steps, delta),
        "gdp": lambda s: gdp_epsilon_of(s, sample_rate, steps, delta),
        "pld": lambda s: dp_sgd_epsilon(s, sample_rate, steps, delta, discretization),
    }
    rows = [AccountantRow(
        accountant=name, label=LABELS[name], noise_multiplier=sigma,
        is_upper_bound=name != "gdp",
        epsilon_by={other: evaluate[other](sigma) for other in evaluate},
        filter_epsilon=filter_epsilon(sigma, sample_rate, steps, delta, order),
        note=NOTES[name]) for name, sigma in sigmas.items()]
    charge = rows[2].filter_epsilon
    return AccountantComparison(
        target_epsilon=target_epsilon, delta=delta, sample_rate=sample_rate, steps=steps,
        rows=rows, ledger_calibrates_with="pld", ledger_noise_multiplier=sigmas["pld"],
        filter_order=order, epsilon_limit=limit, ledger_charge_epsilon=charge,
        admissible_on_fresh_budget=charge <= limit,
        explanation=_explain(sigmas, target_epsilon, order, limit, charge))


def _explain(sigmas: dict[AccountantName, float], target: float, order: int, limit: float,
             charge: float) -> list[str]:
    return [
        f"The ledger gives the job the PLD sigma {sigmas['pld']:.4g}: PLD is tight, so it "
        "needs the least noise of the two accountants that bound epsilon "
        f"(RDP would need {sigmas['rdp']:.4g}).",
        f"GDP's sigma {sigmas['gdp']:.4g} comes from a central limit theorem: an "
        "approximation, not a bound, so it is shown and never used.",
        "PLD/PRV composition assumes the sequence of jobs is fixed in advance; jobs chosen "
        "after seeing earlier results compose only under the ledger's RDP filter.",
        f"So admission charges the PLD sigma's RDP at the dataset's fixed order "
        f"alpha*={order} (fixed for an epsilon limit of {limit:g}): filter epsilon "
        f"{charge:.4g} against the job's target {target:g}; RDP at one fixed order is looser "
        "than PLD, and far looser when the job's best order is below alpha* (little noise, "
        "many steps).",
        (f"A fresh budget of epsilon limit {limit:g} admits this job." if charge <= limit
         else f"A fresh budget of epsilon limit {limit:g} would REFUSE this job: a larger "
         "limit, more noise (a smaller target) or fewer steps bring the charge down."),
    ]


__all__ = ["LABELS", "compare_accountants", "filter_epsilon", "gdp_epsilon_of",
           "gdp_mu_of", "gdp_sigma", "rdp_curve", "rdp_epsilon", "rdp_sigma"]
