"""The RDP privacy filter that decides admission (docs/privacy.md).

Feldman & Zrnic 2021, "Individual Privacy Accounting via a Rényi Filter" (NeurIPS 2021),
Thm. 3.1: for a FIXED order α, a sequence of mechanisms whose RDP parameters ρ_t at α are
chosen adaptively (each may depend on all earlier outputs) is (α, B)-RDP as long as the
mechanism is stopped before Σ_t ρ_t exceeds B. The filter below is exactly that stopping rule,
applied per partition (records in disjoint, publicly labelled partitions compose in parallel).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dpsynth_ledger.accounting.rdp import add_up, rdp_to_epsilon

# Why one fixed order: the filter's guarantee is a statement about the sum of RDP at ONE α
# (a martingale argument at that α). Were the order re-optimised after each job (the usual
# "min over α" of a non-adaptive RDP accountant), the choice of α would itself depend on the
# adaptively chosen sequence, and Rényi composition would no longer bound the privacy loss.
# α* is therefore chosen once, from (ε limit, δ) alone, when the dataset is created.
#
# Why PLD is only a report: PLD/PRV composition (like optimal composition theorems in
# general) assumes the mechanisms' privacy parameters are fixed before any data is touched.
# Users pick the next job after seeing the last one's output, so the PLD figure of the
# realised sequence is NOT a guarantee under adaptive use; it is shown beside the filter figure,
# labelled as such, and never used to admit.


@dataclass(frozen=True)
class RdpFilter:
    """Admission at a fixed order: admit iff committed + reserved + new ≤ budget everywhere.

    Attributes:
        order: the dataset's admission order α*.
        rdp_budget: the RDP budget at α* (``epsilon_to_rdp_budget(limit, α*, δ)``).
        delta: the dataset's δ, for the ε figures.
    """

    order: int
    rdp_budget: float
    delta: float

    def total_after(self, committed: float, reserved: float, new: float) -> float:
        """committed + reserved + new, rounded upwards at each addition."""
        return add_up(add_up(committed, reserved), new)

    def admits(self, *, committed: Mapping[str, float], reserved: Mapping[str, float],
               new: Mapping[str, float]) -> bool:
        """True iff every partition touched by ``new`` stays within the budget.

        Args:
            committed: RDP charged so far, per partition.
            reserved: RDP held by open reservations, per partition.
            new: the RDP the candidate adds, per partition it touches.
        """
        if any(amount < 0 for amount in new.values()):
            raise ValueError("a charge cannot be negative")
        return all(
            self.total_after(committed.get(p, 0.0), reserved.get(p, 0.0), amount)
            <= self.rdp_budget
            for p, amount in new.items()
        )

    def room(self, *, committed: Mapping[str, float], reserved: Mapping[str, float],
             partitions: list[str]) -> float:
        """The largest RDP a job touching ``partitions`` could still add (≥ 0)."""
        used = max((add_up(committed.get(p, 0.0), reserved.get(p, 0.0)) for p in partitions),
                   default=0.0)
        return max(0.0, self.rdp_budget - used)

    def epsilon(self, rdp: float) -> float:
        """The filter's ε figure of an accumulator (the named conversion at α*)."""
        return rdp_to_epsilon(rdp, self.order, self.delta)
