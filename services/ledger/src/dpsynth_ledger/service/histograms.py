"""Use cases: release a dataset's class sizes through a charged Gaussian histogram, and set
the released sizes on its budget.

The histogram has one count per declared label. Under add/remove, adding or removing one
record changes exactly one count by 1 (every record has exactly one label), so its L2
sensitivity is 1 (under replace-one two counts change by 1: √2). Adding N(0, σ²) to every
count is ONE Gaussian mechanism; σ is the analytic Gaussian mechanism's for (target, δ) at
the dataset's δ (Balle & Wang 2018), raised until its reported figure, ``dp_accounting``'s
PLD of the ``GaussianDpEvent``, meets the target too (accounting.gaussian.calibrate_gaussian_sigma:
milliseconds at any target). Its RDP at α* is α*·Δ²/(2σ²).

The record is the dataset's privacy unit: on a ``subject`` dataset the counts are SUBJECTS
per class (the public N̂_c of user-level per-label training), and the argument above needs
every subject to fall in one class (``partitions_disjoint``). When the labels are not
disjoint in the unit, one subject moves up to every count (the L2 norm of its 0/1 class
vector, up to √(number of labels); with image counts, unbounded): the ledger then REFUSES
the release rather than calibrate to a sensitivity it cannot check; such datasets declare
class sizes at upload instead.

Admission goes through the RDP filter like every other event, all or nothing under the
budget-row lock. Each class partition sees its own count (one Gaussian release on that
partition) and partition ``"*"`` the whole histogram, so every partition is charged the full
α*·Δ²/(2σ²) once. The charge is committed at once: the release happens in the same request.
"""

from __future__ import annotations

import math
from typing import Any

from dpsynth_shared.dp_events import GaussianEvent, Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound, budget_refusal
from dpsynth_shared.ids import new_id
from dpsynth_shared.ledger_contract import BudgetView
from dpsynth_shared.release_contract import HistogramRelease, HistogramRequest, SetClassSizes
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    WHOLE_DATASET,
    add_up,
    gaussian_discretization,
    gaussian_epsilon,
    rdp_at_order,
)
from dpsynth_ledger.book import (
    charge,
    disjoint_of,
    figures,
    flt,
    labels_of,
    snapshot,
    touched,
)
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.metrics import counts_refusals
from dpsynth_ledger.models import Accumulator, Budget
from dpsynth_ledger.service.budgets import check_sizes
from dpsynth_ledger.service.plans import refusal_numbers
from dpsynth_ledger.views import budget_view

RELEASED = "histogram_released"
REFUSED = "histogram_refused"
SIZES_SET = "class_sizes_set"
SIGMA_RTOL = 1e-4
"""Relative tolerance of :func:`calibrate_gaussian_sigma` (its σ is the upper end)."""


def sensitivity(neighbouring: str) -> float:
    """L2 sensitivity of a histogram over disjoint classes under the dataset's relation."""
    return 1.0 if neighbouring == Neighbouring.ADD_REMOVE else math.sqrt(2.0)


def _refuse_sized(budget: Budget) -> None:
    if budget.class_sizes is not None:
        raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has public class sizes")
    if not disjoint_of(budget):
        raise DpsynthError(
            ErrorCode.INVALID_REQUEST, "the dataset's labels are not disjoint in its privacy "
            "unit (a unit falls in two or more classes): one unit moves several counts of the "
            "class-size histogram, so its sensitivity is not 1 and this release is refused; "
            "declare class_sizes (units per class) at upload instead",
            privacy_unit=budget.privacy_unit, partitions_disjoint=False)


def _event(budget: Budget, target: float, ctx: LedgerContext) -> tuple[GaussianEvent, float]:
    """The calibrated release and its standalone PLD epsilon."""
    s = sensitivity(budget.neighbouring)
    try:
        multiplier = ctx.heavy.gaussian_sigma(target, budget.delta)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    event = GaussianEvent(sigma=multiplier * s, sensitivity=s,
                          neighbouring=Neighbouring(budget.neighbouring))
    return event, gaussian_epsilon(multiplier, budget.delta,
                                   gaussian_discretization(target, ctx.discretization))


def max_admissible_histogram_target(budget: Budget, room: float,
                                    ctx: LedgerContext) -> float | None:
    """The largest target whose release fits ``room``: σ/Δ ≥ sqrt(α*/(2·room)), taken with
    the calibration's tolerance as margin (ε decreases in σ); None when nothing fits."""
    if room <= 0:
        return None
    multiplier = math.sqrt(budget.admission_order / (2.0 * room)) * (1 + 2 * SIGMA_RTOL)
    return gaussian_epsilon(multiplier, budget.delta, ctx.discretization)


def _release(budget: Budget, accs: dict[str, Accumulator], *, event: GaussianEvent,
             epsilon: float, target: float) -> HistogramRelease:
    """The release against the accounts BEFORE its charge (a dry run shows exactly this)."""
    f = flt(budget)
    rdp = rdp_at_order(event, budget.admission_order)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    train = touched(WHOLE_DATASET, accs)  # the held-out partition does not see the counts
    held = max(f.total_after(accs[p].committed, accs[p].reserved, rdp) for p in train)
    return HistogramRelease(
        dataset_id=budget.dataset_id, event=event, target_epsilon=target, epsilon=epsilon,
        delta=budget.delta, admission_order=budget.admission_order, rdp_charge=rdp,
        partitions=train,
        dataset_epsilon_spent_before=figures(budget, accs)["dataset_epsilon_spent"],
        dataset_epsilon_spent_after=f.epsilon(max(add_up(c, rdp if p in train else 0.0)
                                                  for p, c in committed.items())),
        dataset_epsilon_remaining_after=max(0.0, budget.epsilon_limit - f.epsilon(held)),
        admissible=f.admits(committed=committed, reserved=reserved, new={p: rdp for p in train}),
        charged=False, accountant=ACCOUNTANT_NAME)


@counts_refusals("histogram")
def release_histogram(session: Session, *, dataset_id: str, request: HistogramRequest,
                      ctx: LedgerContext) -> HistogramRelease:
    """Admit and charge the class-size histogram (or, with ``dry_run``, only show it).

    σ is calibrated outside the lock; then one transaction takes the budget row, checks
    committed + reserved + α*Δ²/(2σ²) ≤ budget on EVERY partition, and either charges every
    partition and records a ``histogram_released`` entry, or records ``histogram_refused``.

    Raises:
        NotFound: no budget for the dataset.
        DpsynthError: ``conflict`` when the dataset already has class sizes;
            ``invalid_request`` when it declares no labels or the target is unreachable.
        BudgetExhausted: 409 with the numbers (nothing charged; the refusal is recorded).
    """
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    _refuse_sized(budget)
    if not labels_of(repo.accumulators(session, dataset_id)):
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "the dataset declares no labels")
    event, epsilon = _event(budget, request.target_epsilon, ctx)
    if request.dry_run:
        plan = _release(budget, repo.accumulators(session, dataset_id), event=event,
                        epsilon=epsilon, target=request.target_epsilon)
        session.commit()
        return plan
    session.commit()  # end the read transaction: the decision is taken under the lock only
    budget = repo.lock_budget(session, dataset_id)
    assert budget is not None
    try:
        _refuse_sized(budget)
    except DpsynthError:
        session.rollback()
        raise
    accs = repo.accumulators(session, dataset_id)
    f = flt(budget)
    rdp = rdp_at_order(event, budget.admission_order)
    new = {p: rdp for p in touched(WHOLE_DATASET, accs)}
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    release_id = new_id("release")
    details: dict[str, Any] = {
        "release_id": release_id, "event": event.model_dump(mode="json"),
        "target_epsilon": request.target_epsilon, "epsilon": epsilon,
        "admission_order": budget.admission_order, "rdp_requested": rdp}
    if not f.admits(committed=committed, reserved=reserved, new=new):
        numbers = refusal_numbers(budget, accs, target=request.target_epsilon,
                                  job_epsilon=epsilon, new=new)
        append_entry(session, dataset_id=dataset_id, kind=REFUSED, payload={
            **details, "decision": "refused", "numbers": numbers,
            "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
        session.commit()
        room = f.room(committed=committed, reserved=reserved, partitions=list(new))
        raise budget_refusal({k: v for k, v in numbers.items() if k != "accumulators"},
                             best=max_admissible_histogram_target(budget, room, ctx),
                             held=f.room(committed=committed, reserved={},
                                         partitions=list(new)) > 0,
                             what="class-size histogram")
    out = _release(budget, accs, event=event, epsilon=epsilon, target=request.target_epsilon)
    rdp_delta = charge(accs, WHOLE_DATASET, rdp)  # "*" and every label, once each
    append_entry(session, dataset_id=dataset_id, kind=RELEASED, payload={
        **details, "decision": "accepted", "rdp_delta": rdp_delta,
        "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
    session.commit()
    ctx.metrics.accepted("histogram")
    ctx.metrics.histogram_releases.inc()
    return out.model_copy(update={"release_id": release_id, "charged": True})


def set_class_sizes(session: Session, *, dataset_id: str, request: SetClassSizes,
                    ctx: LedgerContext) -> BudgetView:
    """Set the budget's public class sizes from a charged histogram release (once).

    The sizes are post-processing of the release named by ``release_id`` (a
    ``histogram_released`` entry of this dataset); the ``class_sizes_set`` entry records them.

    Raises:
        NotFound: no budget for the dataset.
        DpsynthError: ``conflict`` when the budget already has class sizes;
            ``invalid_request`` for sizes outside [1, N̂] or not naming exactly the labels,
            or an unknown release.
    """
    budget = repo.lock_budget(session, dataset_id)
    if budget is None:
        session.rollback()
        raise NotFound("budget", dataset_id)
    try:
        _refuse_sized(budget)
        labels = labels_of(repo.accumulators(session, dataset_id))
        check_sizes(request.class_sizes, labels, budget.declared_size)
        release = next((e for e in repo.entries(session, dataset_id=dataset_id)
                        if e.kind == RELEASED and "statistic" not in e.payload  # not N̂'s
                        and e.payload.get("release_id") == request.release_id), None)
        if release is None:
            raise DpsynthError(ErrorCode.INVALID_REQUEST, "release_id names no histogram "
                               "release of this dataset", release_id=request.release_id)
    except DpsynthError:
        session.rollback()
        raise
    sizes = {c: int(n) for c, n in sorted(request.class_sizes.items())}
    budget.class_sizes = sizes
    append_entry(session, dataset_id=dataset_id, kind=SIZES_SET, payload={
        "class_sizes": sizes, "source": request.source, "release_id": request.release_id,
        "release_seq": release.seq})
    session.commit()
    return budget_view(session, budget, ctx.discretization, inline=ctx.tight_inline)
