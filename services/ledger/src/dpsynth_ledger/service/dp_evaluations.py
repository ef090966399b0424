"""Use case: a DP evaluation release, charged to the budget's HELD-OUT partition.

An evaluate job with ``dp`` releases, for each downstream classifier trained on the
synthetic corpus alone, the number of the dataset's held-out records it classifies
correctly, plus Gaussian noise, divided by a PUBLIC held-out size N̂_h (never the true
count). Semantics (docs/privacy.md, "DP evaluations: selection inside the guarantee"):

* **Sensitivity.** The classifiers are post-processing of the corpus (a DP output of the
  training part, or public), so adding or removing one held-out record moves each of the m
  counts by at most 1: the vector has L2 sensitivity √m (under replace-one too: the removed
  record's −1 and the added one's +1 fall on the same count). Adding N(0, σ²) to each count is
  ONE Gaussian mechanism; σ = multiplier·√m, the multiplier calibrated by PLD to be
  (target, δ)-DP at the dataset's δ, as for the class-size histogram. RDP at α*: α*·m/(2σ²).
* **Partition.** The held-out records are disjoint from the training records (a 1-stable
  keyed-hash split: adding or removing one unit changes one side only), so the release enters
  the held-out partition :data:`~dpsynth_ledger.accounting.HOLDOUT` ALONE: training jobs and
  histograms never touch it and it never touches ``"*"`` or a label. Per record the loss is
  bounded by its own side's accumulator, so the filter figure is the max over all partitions,
  the held-out one included (parallel composition, McSherry 2009).
* **Admission** is the Feldman–Zrnic filter on that partition, under the budget-row lock,
  committed at once (the worker draws the noise only after this returns, from OS entropy). A
  refusal records ``dp_evaluation_refused`` and answers 409 with the numbers; an accepted
  release records ``dp_evaluation_released`` with its ``GaussianEvent`` and ``rdp_delta``
  ({HOLDOUT: charge}); ``GET /v1/chain/verify`` recomputes both.
* Each call is a new release (a retried attempt pays again: never under-counted). It must
  name an evaluation authorised for the same job (``POST /v1/evaluations``).
"""

from __future__ import annotations

import math
from typing import Any

from dpsynth_shared.dp_events import GaussianEvent, Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound, budget_refusal
from dpsynth_shared.ids import new_id
from dpsynth_shared.release_contract import DpEvaluationRelease, DpEvaluationRequest
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    HOLDOUT,
    add_up,
    gaussian_discretization,
    gaussian_epsilon,
    rdp_at_order,
)
from dpsynth_ledger.book import charge, figures, flt, snapshot
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.metrics import counts_refusals
from dpsynth_ledger.models import Accumulator, Budget, EvaluationRow
from dpsynth_ledger.service.histograms import max_admissible_histogram_target
from dpsynth_ledger.service.plans import refusal_numbers

RELEASED = "dp_evaluation_released"
REFUSED = "dp_evaluation_refused"
KINDS = (RELEASED, REFUSED)


def sensitivity(metrics: int) -> float:
    """L2 sensitivity of ``metrics`` correct-classification counts on the held-out part."""
    return math.sqrt(metrics)


def event_of(budget: Budget, request: DpEvaluationRequest,
             ctx: LedgerContext) -> tuple[GaussianEvent, float]:
    """The calibrated release (recorded under the dataset's relation: Δ = √m under both)
    and its standalone PLD epsilon."""
    s = sensitivity(len(request.metrics))
    try:
        multiplier = ctx.heavy.gaussian_sigma(request.target_epsilon, budget.delta)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    event = GaussianEvent(sigma=multiplier * s, sensitivity=s,
                          neighbouring=Neighbouring(budget.neighbouring))
    return event, gaussian_epsilon(multiplier, budget.delta,
                                   gaussian_discretization(request.target_epsilon,
                                                           ctx.discretization))


def holdout_accumulator(session: Session, dataset_id: str) -> dict[str, Accumulator]:
    """The dataset's accumulators, with the held-out partition's row created (zero) when it
    has none yet (called under the budget-row lock)."""
    accs = repo.accumulators(session, dataset_id)
    if HOLDOUT not in accs:
        row = Accumulator(dataset_id=dataset_id, partition=HOLDOUT, committed=0.0,
                          reserved=0.0)
        session.add(row)
        session.flush()
        accs[HOLDOUT] = row
    return accs


def _plan(budget: Budget, row: EvaluationRow, accs: dict[str, Accumulator],
          request: DpEvaluationRequest, event: GaussianEvent,
          epsilon: float) -> DpEvaluationRelease:
    """The release against the accounts BEFORE its charge (a dry run shows exactly this)."""
    f = flt(budget)
    rdp = rdp_at_order(event, budget.admission_order, budget.neighbouring)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    after = dict(committed)
    after[HOLDOUT] = add_up(committed.get(HOLDOUT, 0.0), rdp)
    return DpEvaluationRelease(
        evaluation_id=row.evaluation_id, dataset_id=budget.dataset_id, job_id=row.job_id,
        event=event, metrics=list(request.metrics), holdout_size=request.holdout_size,
        target_epsilon=request.target_epsilon, epsilon=epsilon, delta=budget.delta,
        admission_order=budget.admission_order, rdp_charge=rdp, partition=HOLDOUT,
        dataset_epsilon_spent_before=figures(budget, accs)["dataset_epsilon_spent"],
        dataset_epsilon_spent_after=f.epsilon(max(after.values(), default=0.0)),
        admissible=f.admits(committed=committed, reserved=reserved, new={HOLDOUT: rdp}),
        charged=False, accountant=ACCOUNTANT_NAME)


def _authorisation(session: Session, evaluation_id: str,
                   request: DpEvaluationRequest) -> EvaluationRow:
    row = session.get(EvaluationRow, evaluation_id)
    if row is None:
        raise NotFound("evaluation", evaluation_id)
    if row.job_id != request.job_id:
        raise DpsynthError(ErrorCode.CONFLICT, "the evaluation was authorised for another job",
                           evaluation_id=evaluation_id)
    return row


@counts_refusals("dp_evaluation")
def release(session: Session, *, evaluation_id: str, request: DpEvaluationRequest,
            ctx: LedgerContext) -> DpEvaluationRelease:
    """Admit and charge one DP evaluation release (or, with ``dry_run``, only show it).

    Raises:
        NotFound: an unknown evaluation or budget.
        DpsynthError: ``conflict`` when the evaluation belongs to another job;
            ``invalid_request`` for an unreachable target.
        BudgetExhausted: 409 with the numbers (nothing charged; the refusal is recorded).
    """
    row = _authorisation(session, evaluation_id, request)
    budget = repo.get_budget(session, row.dataset_id)
    if budget is None:
        raise NotFound("budget", row.dataset_id)
    event, epsilon = event_of(budget, request, ctx)
    if request.dry_run:
        plan = _plan(budget, row, repo.accumulators(session, budget.dataset_id), request,
                     event, epsilon)
        session.commit()
        return plan
    session.commit()  # end the read transaction: the decision is taken under the lock only
    budget = repo.lock_budget(session, row.dataset_id)
    assert budget is not None
    accs = holdout_accumulator(session, budget.dataset_id)
    out = _plan(budget, row, accs, request, event, epsilon)
    rdp = out.rdp_charge
    release_id = new_id("release")
    details: dict[str, Any] = {
        "release_id": release_id, "evaluation_id": row.evaluation_id, "job_id": row.job_id,
        "attempt": request.attempt, "event": event.model_dump(mode="json"),
        "metrics": list(request.metrics), "holdout_size": request.holdout_size,
        "target_epsilon": request.target_epsilon, "epsilon": epsilon,
        "admission_order": budget.admission_order, "partition": HOLDOUT,
        "rdp_requested": rdp}
    if not out.admissible:
        numbers = refusal_numbers(budget, accs, target=request.target_epsilon,
                                  job_epsilon=epsilon, new={HOLDOUT: rdp})
        append_entry(session, dataset_id=budget.dataset_id, kind=REFUSED, payload={
            **details, "decision": "refused", "numbers": numbers,
            "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
        session.commit()
        f = flt(budget)
        room = f.room(committed={HOLDOUT: accs[HOLDOUT].committed},
                      reserved={HOLDOUT: accs[HOLDOUT].reserved}, partitions=[HOLDOUT])
        raise budget_refusal({k: v for k, v in numbers.items() if k != "accumulators"},
                             best=max_admissible_histogram_target(budget, room, ctx),
                             held=f.room(committed={HOLDOUT: accs[HOLDOUT].committed},
                                         reserved={}, partitions=[HOLDOUT]) > 0,
                             what="DP evaluation (on the held-out partition)")
    rdp_delta = charge(accs, HOLDOUT, rdp)  # the held-out partition alone
    append_entry(session, dataset_id=budget.dataset_id, kind=RELEASED, payload={
        **details, "decision": "accepted", "rdp_delta": rdp_delta,
        "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
    session.commit()
    ctx.metrics.accepted("dp_evaluation")
    return out.model_copy(update={"release_id": release_id, "charged": True})
