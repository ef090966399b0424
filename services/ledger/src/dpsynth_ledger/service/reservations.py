"""Use cases: reserve (admission through the filter), extend, close.

Calibration and PLD run outside the lock; then ONE transaction takes the dataset's budget row
(``SELECT … FOR UPDATE``), checks committed + reserved + new ≤ budget on every partition,
writes the reservation and the chain entry (accepted or refused) and commits.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.errors import (
    BudgetExhausted,
    DpsynthError,
    ErrorCode,
    NotFound,
    budget_refusal,
)
from dpsynth_shared.ids import new_reservation_id
from dpsynth_shared.ledger_contract import (
    CloseRequest,
    ExtendRequest,
    Plan,
    PlanRequest,
    Reservation,
    ReservationState,
    ReserveRequest,
)
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import WHOLE_DATASET, mul_up
from dpsynth_ledger.book import (
    disjoint_of,
    figures,
    flt,
    refresh_reserved,
    run_of,
    runs,
    snapshot,
    sync_totals,
    touched,
)
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.metrics import counts_refusals
from dpsynth_ledger.models import Budget, ReservationPart, ReservationRow
from dpsynth_ledger.service.plans import (
    RunPlan,
    max_target,
    new_charges,
    plan_with_runs,
    refusal_numbers,
    with_release,
)
from dpsynth_ledger.views import event_of, reservation_view


def locked(session: Session, reservation_id: str) -> tuple[Budget, ReservationRow]:
    """Lock the reservation's dataset budget row, then re-read the reservation under it."""
    res = repo.get_reservation(session, reservation_id)
    if res is None:
        raise NotFound("reservation", reservation_id)
    session.expire_all()
    budget = repo.lock_budget(session, res.dataset_id)
    res = repo.get_reservation(session, reservation_id)
    assert budget is not None and res is not None
    return budget, res


def write_entry(session: Session, budget: Budget, res: ReservationRow, kind: str,
                **extra: Any) -> None:
    """Chain entry about one reservation, with the accumulators and figures after it."""
    accs = repo.accumulators(session, budget.dataset_id)
    if res.per_label:  # one hold per class: the replay needs each (chain_replay.py, Replay)
        extra = {"per_label": True, "label_rdp_outstanding": {
            p.partition: p.rdp_outstanding for p in res.parts}, **extra}
    append_entry(session, dataset_id=budget.dataset_id, kind=kind, payload={
        "job_id": res.job_id, "reservation_id": res.reservation_id,
        "partition": res.partition, "admission_order": budget.admission_order,
        "reservation_rdp_outstanding": res.rdp_outstanding,
        "accumulators_after": snapshot(accs), "figures": figures(budget, accs), **extra,
    })


def _row(request: ReserveRequest, budget: Budget, runs_: list[RunPlan]) -> ReservationRow:
    """The reservation row of an admitted candidate (per label: one part per class)."""
    now = datetime.now(UTC)
    common = {"reservation_id": new_reservation_id(), "job_id": request.job_id,
              "dataset_id": budget.dataset_id, "state": ReservationState.OPEN,
              "target_epsilon": request.target_epsilon, "steps_granted": 0,
              "current_attempt": 0, "created_at": now}
    if request.per_label is None:
        (run,) = runs_
        return ReservationRow(
            **common, partition=WHOLE_DATASET, per_label=False, noise_multiplier=run.sigma,
            sample_rate=run.q, expected_batch_size=run.batch, steps_planned=run.steps,
            steps_reserved=run.steps, rdp_per_step=run.rdp_per_step, rdp_outstanding=run.rdp_total)
    res = ReservationRow(**common, partition="", per_label=True, noise_multiplier=None,
                         sample_rate=None, expected_batch_size=None, rdp_per_step=None,
                         steps_reserved=0, rdp_outstanding=0.0)
    res.parts = [ReservationPart(
        partition=run.partition, noise_multiplier=run.sigma, sample_rate=run.q,
        expected_batch_size=run.batch, steps_planned=run.steps, steps_reserved=run.steps,
        steps_granted=0, rdp_per_step=run.rdp_per_step, rdp_outstanding=run.rdp_total)
        for run in runs_]
    sync_totals(res)
    return res


@counts_refusals("reservation")
def reserve(session: Session, *, request: ReserveRequest,
            ctx: LedgerContext) -> Reservation | Plan:
    """Admit a DP-SGD job through the filter, idempotently on ``job_id``.

    A per-label job is ONE admission: every class's run must fit its own partition, or
    nothing is reserved (all-or-nothing under the budget-row lock).

    Returns:
        The reservation (with its plan), or only the plan when ``dry_run``.

    Raises:
        BudgetExhausted: 409 ``privacy_budget_exhausted`` with the numbers and the largest
            admissible target (the refusal is recorded in the chain first).
    """
    existing = repo.get_reservation_by_job(session, request.job_id)
    if existing is not None and not request.dry_run:
        budget = repo.get_budget(session, existing.dataset_id)
        assert budget is not None
        return reservation_view(existing, budget, ctx.discretization)
    plan, runs_ = plan_with_runs(session, request=PlanRequest(
        neighbouring=request.neighbouring,
        dataset_id=request.dataset_id, target_epsilon=request.target_epsilon,
        expected_batch_size=request.expected_batch_size, steps=request.steps,
        per_label=request.per_label, population_size=request.population_size,
        central_images=request.central_images), ctx=ctx, with_report=request.dry_run)
    if request.dry_run:
        return plan
    session.commit()  # end the read transaction: the decision is taken under the lock only
    budget = repo.lock_budget(session, request.dataset_id)
    assert budget is not None
    existing = repo.get_reservation_by_job(session, request.job_id)
    if existing is not None:
        session.commit()
        return reservation_view(existing, budget, ctx.discretization)
    accs = repo.accumulators(session, budget.dataset_id)
    release = plan.central_images  # the job's central-image release: must fit beside it now
    new = with_release(new_charges(runs_, accs, disjoint_of(budget)), release)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    admitted = flt(budget).admits(committed=committed, reserved=reserved, new=new)
    res = _row(request, budget, runs_)
    details = {"attempt": 0, "steps": res.steps_reserved,
               "event": plan.event.model_dump(mode="json"),
               "target_epsilon": request.target_epsilon, "job_epsilon": plan.job_epsilon,
               "rdp_requested": plan.rdp_total}
    if request.population_size is not None:  # a derived or linked dataset's public N̂
        details["population_size"] = request.population_size
    if release is not None:  # informational: the release is charged by its own entry
        details["central_images"] = {"event": release.event.model_dump(mode="json"),
                                     "epsilon": release.epsilon,
                                     "rdp_charge": release.rdp_charge}
    if not admitted:
        numbers = refusal_numbers(budget, accs, target=request.target_epsilon,
                                  job_epsilon=plan.job_epsilon, new=new)
        res.rdp_outstanding = 0.0
        for part in res.parts:
            part.rdp_outstanding = 0.0
        write_entry(session, budget, res, "reservation_refused", decision="refused",
                    numbers=numbers, **details)
        session.commit()
        raise _refusal(budget, runs_, numbers, committed=committed,
                       reserved=with_release(reserved, release), partitions=list(new),
                       ctx=ctx)
    repo.add(session, res)
    refresh_reserved(accs, repo.reservations_of(session, budget.dataset_id),
                     disjoint_of(budget))
    write_entry(session, budget, res, "reservation_accepted", decision="accepted", **details)
    session.commit()
    ctx.metrics.accepted("reservation")
    view = reservation_view(res, budget, ctx.discretization)
    return view.model_copy(update={"plan": plan})


def _refusal(budget: Budget, runs_: list[RunPlan], numbers: dict[str, object], *,
             committed: dict[str, float], reserved: dict[str, float], partitions: list[str],
             ctx: LedgerContext) -> BudgetExhausted:
    """A job's refusal, saying first the largest target admitted now (issue 15, item 3);
    ``refusal`` tells it from a budget held by running jobs (room comes back when they end)
    or exhausted, under the stable code ``privacy_budget_exhausted`` clients act on."""
    best, computed = _max_target_if_free(budget, runs_, committed=committed,
                                         reserved=reserved, ctx=ctx)
    held = flt(budget).room(committed=committed, reserved={}, partitions=partitions) > 0
    return budget_refusal({k: v for k, v in numbers.items() if k != "accumulators"},
                          best=best, computed=computed, held=held)


def _max_target_if_free(budget: Budget, runs_: list[RunPlan], *,
                        committed: dict[str, float], reserved: dict[str, float],
                        ctx: LedgerContext) -> tuple[float | None, bool]:
    """A refusal's largest admissible target (None when no σ ≤ 1e4 fits), computed in a
    heavy slot, and whether it was computed: not when every slot is taken (the refusal
    itself must not turn into ``ledger_busy``)."""
    try:
        with ctx.heavy.slot("a refusal's largest admissible target"):
            return max_target(budget, runs_, committed=committed, reserved=reserved,
                              ctx=ctx), True
    except DpsynthError as exc:
        if exc.code == ErrorCode.LEDGER_BUSY:
            return None, False
        raise


def check_live(res: ReservationRow, attempt: int) -> None:
    """Refuse changes to a closed reservation, and attempts other than the current one."""
    if res.state == ReservationState.CLOSED:
        raise DpsynthError(ErrorCode.CONFLICT, "the reservation is closed")
    if attempt != res.current_attempt:
        raise DpsynthError(ErrorCode.STALE_ATTEMPT,
                           f"attempt {attempt} is not the current attempt "
                           f"{res.current_attempt}", current_attempt=res.current_attempt)


@counts_refusals("extension")
def extend(session: Session, *, reservation_id: str, request: ExtendRequest,
           ctx: LedgerContext) -> Reservation:
    """A NEW admission through the filter for ``additional_steps`` at the same σ and q
    (per label: of the class ``request.partition``, against that class's partition).

    Raises:
        BudgetExhausted: 409 when the filter refuses (recorded in the chain first).
        DpsynthError: 422 ``plan_too_large`` when the run would exceed ``max_steps``.
    """
    budget, res = locked(session, reservation_id)
    check_live(res, request.attempt)
    run = run_of(res, request.partition)
    ctx.heavy.check_steps(run.steps_reserved + request.additional_steps)
    accs = repo.accumulators(session, budget.dataset_id)
    added = mul_up(request.additional_steps, run.rdp_per_step)
    new = {p: added for p in touched(run.partition, accs, disjoint_of(budget))}
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    details = {"attempt": request.attempt, "steps": request.additional_steps,
               "event": event_of(run, request.additional_steps).model_dump(mode="json"),
               "rdp_requested": added}
    if res.per_label:
        details["label"] = run.partition
    if not flt(budget).admits(committed=committed, reserved=reserved, new=new):
        numbers = refusal_numbers(budget, accs, target=res.target_epsilon,
                                  job_epsilon=0.0, new=new)
        write_entry(session, budget, res, "extension_refused", decision="refused",
                    numbers=numbers, **details)
        session.commit()
        room = flt(budget).room(committed=committed, reserved=reserved, partitions=list(new))
        raise BudgetExhausted(
            "the dataset's privacy filter refuses the extension",
            **{k: v for k, v in numbers.items() if k != "accumulators"},
            max_additional_steps=int(room // run.rdp_per_step) if run.rdp_per_step else None)
    run.steps_reserved += request.additional_steps
    run.rdp_outstanding = mul_up(run.steps_reserved - run.steps_granted, run.rdp_per_step)
    sync_totals(res)
    refresh_reserved(accs, repo.reservations_of(session, budget.dataset_id),
                     disjoint_of(budget))
    write_entry(session, budget, res, "extension_accepted", decision="accepted", **details)
    session.commit()
    ctx.metrics.accepted("extension")
    return reservation_view(res, budget, ctx.discretization)


def close(session: Session, *, reservation_id: str, request: CloseRequest,
          ctx: LedgerContext) -> Reservation:
    """Release the un-granted remainder (committed never decreases); idempotent."""
    budget, res = locked(session, reservation_id)
    if res.state == ReservationState.CLOSED:
        session.commit()
        return reservation_view(res, budget, ctx.discretization)
    released = res.rdp_outstanding
    released_by_label = {p.partition: p.rdp_outstanding for p in res.parts}
    res.state, res.outcome, res.closed_at = ReservationState.CLOSED, request.outcome, \
        datetime.now(UTC)
    for run in runs(res):  # every class of a per-label job closes with it
        run.rdp_outstanding = 0.0
    sync_totals(res)
    accs = repo.accumulators(session, budget.dataset_id)
    refresh_reserved(accs, repo.reservations_of(session, budget.dataset_id),
                     disjoint_of(budget))
    extra = {"rdp_released_by_label": released_by_label} if res.per_label else {}
    write_entry(session, budget, res, "reservation_closed", outcome=request.outcome,
                steps=res.steps_granted, rdp_released=released,
                steps_released=res.steps_reserved - res.steps_granted, **extra)
    session.commit()
    return reservation_view(res, budget, ctx.discretization)
