"""The accountant comparison report of a planned DP-SGD job (issue 20, item 4).

For one target (ε, δ, sample rate q, steps) the ledger calibrates a noise multiplier σ
under each of three accountants (RDP, Gaussian DP by its central limit theorem, PLD), and
evaluates every σ under every accountant, so a user sees why the numbers differ and which
one the ledger uses (``dpsynth_ledger.accounting.comparison.compare_accountants``); nothing
is charged. Not served over HTTP yet: its PLD calibration is not bounded in time for every
input (over 60 s at q = 1e-8 and one step), and a request that long would hold one of the
ledger's heavy slots from other tenants (docs/accountants.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dpsynth_shared.text import ContractBody

AccountantName = Literal["rdp", "gdp", "pld"]
"""rdp: Rényi DP; gdp: Gaussian DP by the CLT (an approximation); pld: privacy loss
distributions (the tight accountant; PRV computes the same distribution)."""

MAX_COMPARISON_STEPS = 100_000
"""The most steps a comparison accepts (the ledger's default ``max_steps``; the ledger's own
``max_steps`` applies too)."""


class AccountantComparisonRequest(ContractBody):
    """A planned DP-SGD job: Poisson sampling at rate q, ``steps`` steps, add/remove."""

    target_epsilon: float = Field(ge=0.05, le=20.0, description="the job's target ε")
    delta: float = Field(ge=1e-12, le=1e-2, description="the target δ")
    sample_rate: float = Field(ge=1e-8, le=1.0, description="Poisson sampling rate q "
                               "(expected batch size / dataset size; a dataset has at most "
                               "1e8 units, so q >= 1e-8)")
    steps: int = Field(ge=1, le=MAX_COMPARISON_STEPS, description="the run's steps")
    epsilon_limit: float | None = Field(
        None, ge=0.05, le=100.0,
        description="the dataset's ε limit, which fixes its RDP filter order α* (default: "
        "the target, i.e. a dataset this job would exhaust)")


class AccountantRow(BaseModel):
    """One accountant: the σ it calibrates for the target, and that σ under every
    accountant."""

    accountant: AccountantName
    label: str = Field(description="what the accountant is, in words")
    noise_multiplier: float = Field(description="the smallest σ (to its tolerance) whose ε "
                                    "under this accountant is at most the target")
    is_upper_bound: bool = Field(description="true when this accountant's ε is a proven "
                                 "upper bound on the privacy loss; false for GDP (CLT)")
    epsilon_by: dict[AccountantName, float] = Field(
        description="this row's σ evaluated by each accountant (ε at the target δ)")
    filter_epsilon: float = Field(
        description="the ε the ledger's RDP filter would charge for this σ (RDP at the "
        "dataset's fixed order α*, converted there)")
    note: str = ""


class AccountantComparison(BaseModel):
    """The report: one row per accountant, and what the ledger does with them."""

    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    rows: list[AccountantRow]
    ledger_calibrates_with: AccountantName = Field(
        description="the accountant whose σ the ledger gives the job")
    ledger_noise_multiplier: float = Field(description="the σ the ledger gives the job")
    filter_order: int = Field(description="the filter's order α* for the ε limit")
    epsilon_limit: float = Field(description="the ε limit α* was fixed for")
    ledger_charge_epsilon: float = Field(
        description="what admission charges for the ledger's σ: the RDP filter's ε at α* "
        "(the figure that is valid under adaptive use)")
    admissible_on_fresh_budget: bool = Field(
        description="whether a fresh budget of ``epsilon_limit`` would admit the job: its "
        "filter charge within the limit")
    explanation: list[str] = Field(description="why the numbers differ, in sentences")


__all__ = ["MAX_COMPARISON_STEPS", "AccountantComparison", "AccountantComparisonRequest",
           "AccountantName", "AccountantRow"]
