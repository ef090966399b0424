"""Use cases: a dataset's size N̂ released as a charged Gaussian count (issue 13, item 2).

Under add/remove the number of units N is itself private: adding or removing one unit changes
it by exactly 1 (L2 sensitivity Δ = 1). A private upload therefore either declares an upper
bound N̂ ≥ N, or asks for a DP estimate: the count N + Z, Z ~ N(0, σ²), with σ calibrated like
the class-size histogram's (the analytic Gaussian mechanism's σ, checked against
``dp_accounting``'s PLD of its ``GaussianDpEvent``, the upper end kept) to be (target, δ)-DP
at the dataset's δ (the contract keeps δ in [1e-30, 0.5], the limit ≥ 1e-3), which is declared
or fixed and never derived from N. The count is a one-bin histogram: it is recorded with the
histogram's entry kind (``histogram_released``, ``"statistic": "dataset_size"``), so the chain
replay, the recompute report, reconciliation and the tight figure handle it unchanged.

Order: the api asks for σ (:func:`plan_size_release`, stateless: the budget does not exist
yet), draws Z from OS entropy, computes N̂ = ⌈N + Z + z·σ⌉ and sends it with the budget;
:func:`record_size_release` then charges every partition α*·Δ²/(2σ²) in the budget's own
creation transaction, right after ``budget_created``: the budget's first DP event. Nothing is
published before that transaction commits, and nothing is committed without the charge.
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.dp_events import GaussianEvent, Neighbouring
from dpsynth_shared.errors import REFUSAL_EXCEEDS, BudgetExhausted, DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import CreateBudget
from dpsynth_shared.release_contract import SizeReleasePlan, SizeReleasePlanRequest
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    WHOLE_DATASET,
    RdpFilter,
    admission_order,
    epsilon_to_rdp_budget,
    gaussian_discretization,
    gaussian_epsilon,
    rdp_at_order,
)
from dpsynth_ledger.book import charge, figures, snapshot
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget

RELEASED = "histogram_released"
"""The entry kind of every charged one-shot Gaussian release (a count is a one-bin histogram)."""
STATISTIC = "dataset_size"
SIGMA_RTOL = 1e-9
"""How far below the ledger's own calibration a σ sent back with a budget may fall (float
noise only: the api sends the σ this module planned)."""


def _calibrated(target: float, delta: float, neighbouring: Neighbouring,
                ctx: LedgerContext) -> tuple[GaussianEvent, float]:
    """σ of the count for ``target`` at ``delta`` and its standalone PLD epsilon.

    Raises:
        DpsynthError: ``invalid_request`` on a replace-one dataset (N is public there: a
            replacement never changes the count) or when the target is unreachable.
    """
    if neighbouring != Neighbouring.ADD_REMOVE:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "a DP count of the dataset size is for "
                           "add/remove datasets: under replace-one the size is public (a "
                           "replacement never changes it); declare it instead")
    try:
        multiplier = ctx.heavy.gaussian_sigma(target, delta)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    event = GaussianEvent(sigma=multiplier, sensitivity=1.0, neighbouring=neighbouring)
    return event, gaussian_epsilon(multiplier, delta,
                                   gaussian_discretization(target, ctx.discretization))


def plan_size_release(*, request: SizeReleasePlanRequest,
                      ctx: LedgerContext) -> SizeReleasePlan:
    """σ of the count and its charge to a fresh budget of ``epsilon_limit`` at ``delta``."""
    event, epsilon = _calibrated(request.target_epsilon, request.delta, request.neighbouring,
                                 ctx)
    order = admission_order(request.epsilon_limit, request.delta)
    flt = RdpFilter(order=order, rdp_budget=epsilon_to_rdp_budget(
        request.epsilon_limit, order, request.delta), delta=request.delta)
    rdp = rdp_at_order(event, order)
    return SizeReleasePlan(
        event=event, target_epsilon=request.target_epsilon, epsilon=epsilon,
        delta=request.delta, admission_order=order, rdp_charge=rdp,
        rdp_budget=flt.rdp_budget, admissible=rdp <= flt.rdp_budget,
        dataset_epsilon_spent_after=flt.epsilon(rdp), accountant=ACCOUNTANT_NAME)


def check_size_release(request: CreateBudget, order: int, rdp_budget: float,
                       ctx: LedgerContext) -> float | None:
    """Check a budget's size release BEFORE anything is written; its RDP charge (or None).

    The σ sent must be at least the ledger's calibration for the target at the budget's δ
    (the api sends back the planned σ), and its charge must fit the fresh budget.

    Raises:
        DpsynthError: ``invalid_request`` for a σ below the calibration or a replace-one
            dataset; BudgetExhausted (409) when the count alone exceeds the limit.
    """
    release = request.size_release
    if release is None:
        return None
    event, _ = _calibrated(release.target_epsilon, request.delta, request.neighbouring, ctx)
    if release.sigma < event.sigma * (1.0 - SIGMA_RTOL):
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "size_release.sigma is below the "
                           "ledger's calibration for its target_epsilon at the dataset's delta",
                           sigma_required=event.sigma)
    rdp = rdp_at_order(GaussianEvent(sigma=release.sigma, sensitivity=1.0), order)
    if rdp > rdp_budget:
        # nothing is spent yet: the request exceeds what is admissible (issue 15, item 3)
        raise BudgetExhausted(
            f"the DP count of the dataset's size at ε {release.target_epsilon:g} alone would "
            f"exceed the epsilon limit {request.epsilon_limit:g} (its RDP at order {order} "
            "exceeds the limit's budget): lower size_epsilon, raise epsilon_limit, or declare "
            "declared_size", rdp_requested=rdp, rdp_budget=rdp_budget,
            target_epsilon=release.target_epsilon, refusal=REFUSAL_EXCEEDS,
            field="size_epsilon")
    return rdp


def record_size_release(session: Session, budget: Budget, request: CreateBudget,
                        ctx: LedgerContext) -> None:
    """Charge the count to every partition of the budget just created and chain the entry
    (same transaction as ``budget_created``; the caller commits)."""
    release = request.size_release
    assert release is not None
    event = GaussianEvent(sigma=release.sigma, sensitivity=1.0,
                          neighbouring=Neighbouring(budget.neighbouring))
    rdp = rdp_at_order(event, budget.admission_order)
    accs = repo.accumulators(session, budget.dataset_id)
    rdp_delta = charge(accs, WHOLE_DATASET, rdp)  # "*" and every label, once each
    epsilon = gaussian_epsilon(release.sigma, budget.delta,
                               gaussian_discretization(release.target_epsilon,
                                                       ctx.discretization))
    payload: dict[str, Any] = {
        "release_id": release.release_id, "statistic": STATISTIC,
        "event": event.model_dump(mode="json"), "target_epsilon": release.target_epsilon,
        "epsilon": epsilon, "admission_order": budget.admission_order, "rdp_requested": rdp,
        "declared_size": budget.declared_size, "margin_z": release.margin_z,
        "failure_probability": release.failure_probability, "decision": "accepted",
        "rdp_delta": rdp_delta, "accumulators_after": snapshot(accs),
        "figures": figures(budget, accs)}
    append_entry(session, dataset_id=budget.dataset_id, kind=RELEASED, payload=payload)
    ctx.metrics.accepted("histogram")

