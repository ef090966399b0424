"""Use cases: create a budget, read it, plan a job against it."""

from __future__ import annotations

from datetime import UTC, datetime

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ledger_contract import BudgetView, CreateBudget, Plan, PlanRequest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    CONVERSION_NAME,
    WHOLE_DATASET,
    add_up,
    admission_order,
    calibrate_noise_multiplier,
    check_neighbouring,
    dp_sgd_epsilon,
    epsilon_to_rdp_budget,
    max_admissible_target,
    mul_up,
    pld_epsilon,
    rdp_step,
)
from dpsynth_ledger.book import figures, flt, snapshot, touched
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget, ReservationRow
from dpsynth_ledger.views import budget_view, event_of


def create_budget(session: Session, *, request: CreateBudget, ctx: LedgerContext) -> BudgetView:
    """Create a dataset's budget: fix α* and the RDP budget, one accumulator per partition.

    Raises:
        DpsynthError: ``conflict`` when the dataset already has a budget; ``invalid_request``
            when δ ≥ 1/N̂ (DESIGN §3) or a label is named ``"*"``.
    """
    if request.delta >= 1.0 / request.declared_size:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "delta must be below 1/declared_size")
    if WHOLE_DATASET in request.partitions or len(set(request.partitions)) != len(
            request.partitions):
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "labels must be distinct and not '*'")
    order = admission_order(request.epsilon_limit, request.delta)
    budget = Budget(
        dataset_id=request.dataset_id, tenant_id=request.tenant_id,
        epsilon_limit=request.epsilon_limit, delta=request.delta,
        declared_size=request.declared_size, neighbouring=str(request.neighbouring),
        admission_order=order,
        rdp_budget=epsilon_to_rdp_budget(request.epsilon_limit, order, request.delta),
        created_at=datetime.now(UTC),
    )
    partitions = [WHOLE_DATASET, *request.partitions]
    try:
        repo.insert_budget(session, budget, partitions)
    except IntegrityError as exc:
        session.rollback()
        raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has a budget") from exc
    append_entry(session, dataset_id=budget.dataset_id, kind="budget_created", payload={
        "tenant_id": budget.tenant_id, "epsilon_limit": budget.epsilon_limit,
        "delta": budget.delta, "declared_size": budget.declared_size,
        "neighbouring": budget.neighbouring, "partitions": partitions,
        "admission_order": order, "rdp_budget": budget.rdp_budget,
        "conversion": CONVERSION_NAME,
    })
    session.commit()
    view = budget_view(session, budget, ctx.discretization)
    ctx.metrics.budget(budget.dataset_id, view.model_dump())
    return view


def get_budget(session: Session, *, dataset_id: str, ctx: LedgerContext,
               with_history: bool = True) -> BudgetView:
    """The dataset's budget view (filter and tight figures, charge history)."""
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    return budget_view(session, budget, ctx.discretization, with_history)


def sample_rate(budget: Budget, expected_batch_size: int) -> float:
    """q = expected_batch_size / N̂ (DESIGN §3), refused when above 1."""
    if expected_batch_size > budget.declared_size:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "expected_batch_size exceeds the declared dataset size")
    return expected_batch_size / budget.declared_size


def make_plan(session: Session, *, request: PlanRequest, ctx: LedgerContext) -> Plan:
    """Calibrate σ for the standalone target and show the job's cost (no lock, no write)."""
    budget = repo.get_budget(session, request.dataset_id)
    if budget is None:
        raise NotFound("budget", request.dataset_id)
    q = sample_rate(budget, request.expected_batch_size)
    check_neighbouring(DpSgdEvent(noise_multiplier=1.0, sample_rate=q, steps=0),
                       budget.neighbouring)  # type: ignore[arg-type]
    try:
        sigma = calibrate_noise_multiplier(request.target_epsilon, q, request.steps,
                                           budget.delta, ctx.discretization)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    per_step = rdp_step(sigma, q, budget.admission_order)
    total = mul_up(request.steps, per_step)
    accs = repo.accumulators(session, budget.dataset_id)
    reservations = repo.reservations_of(session, budget.dataset_id)
    return plan_from(budget, accs=accs, reservations=reservations, sigma=sigma, q=q,
                     steps=request.steps, batch=request.expected_batch_size, rdp_total=total,
                     rdp_per_step=per_step, ctx=ctx)


def plan_from(budget: Budget, *, accs: dict, reservations: list[ReservationRow],  # type: ignore[type-arg]
              sigma: float, q: float, steps: int, batch: int, rdp_total: float,
              rdp_per_step: float, ctx: LedgerContext) -> Plan:
    """The plan of a calibrated job against a snapshot of the dataset's accounts."""
    f = flt(budget)
    parts = touched(WHOLE_DATASET, accs)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    new = {p: rdp_total for p in parts}
    after = max(f.total_after(committed[p], reserved[p], rdp_total) for p in parts)
    fixed = [event_of(r, r.steps_reserved if r.state != "closed" else r.steps_granted)
             for r in reservations]
    event = DpSgdEvent(noise_multiplier=sigma, sample_rate=q, steps=steps)
    room = f.room(committed=committed, reserved=reserved, partitions=parts)
    return Plan(
        dataset_id=budget.dataset_id, event=event, expected_batch_size=batch,
        job_epsilon=dp_sgd_epsilon(sigma, q, steps, budget.delta, ctx.discretization),
        delta=budget.delta, admission_order=budget.admission_order,
        rdp_per_step=rdp_per_step, rdp_total=rdp_total,
        dataset_epsilon_spent_before=figures(budget, accs)["dataset_epsilon_spent"],
        dataset_epsilon_spent_after=f.epsilon(after),
        dataset_tight_epsilon_after=pld_epsilon([*fixed, event], budget.delta,
                                                ctx.discretization),
        admissible=f.admits(committed=committed, reserved=reserved, new=new),
        max_admissible_target_epsilon=max_admissible_target(
            room, q, steps, budget.admission_order, budget.delta, ctx.discretization),
        accountant=ACCOUNTANT_NAME,
    )


def refusal_numbers(budget: Budget, accs: dict, *, target: float,  # type: ignore[type-arg]
                    job_epsilon: float, new: float) -> dict[str, float | int]:
    """The numbers a refusal carries (observed under the lock)."""
    fig = figures(budget, accs)
    return {
        "epsilon_limit": budget.epsilon_limit,
        "dataset_epsilon_spent": fig["dataset_epsilon_spent"],
        "dataset_epsilon_reserved": fig["dataset_epsilon_reserved"],
        "target_epsilon": target, "job_epsilon": job_epsilon,
        "admission_order": budget.admission_order, "rdp_budget": budget.rdp_budget,
        "rdp_committed": fig["rdp_committed"], "rdp_reserved": fig["rdp_reserved"],
        "rdp_requested": new,
        "rdp_after": add_up(fig["rdp_committed_plus_reserved"], new),
        "accumulators": snapshot(accs),  # type: ignore[dict-item]
    }
