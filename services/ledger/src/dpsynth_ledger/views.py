"""Response bodies built from rows (figures recomputed from the accumulators)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, Neighbouring, ParallelEvent
from dpsynth_shared.ledger_contract import (
    DEFAULT_WARNING_FRACTION,
    BudgetView,
    Charge,
    LabelReservation,
    PrivacyUnit,
    Reservation,
    ReservationState,
)
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import ACCOUNTANT_NAME, dp_sgd_epsilon
from dpsynth_ledger.book import Run, figures, flt, runs
from dpsynth_ledger.chain import CENTRAL_IMAGES_RELEASED, central_event
from dpsynth_ledger.models import Budget, Entry, ReservationRow
from dpsynth_ledger.tight import TightState, compute_missing, released_kind, tight_state


def event_of(run: Run, steps: int) -> DpSgdEvent:
    """One run's mechanism (a whole-dataset reservation, or one class) with ``steps`` steps."""
    return DpSgdEvent(noise_multiplier=run.noise_multiplier, sample_rate=run.sample_rate,
                      steps=steps)


def job_event(res: ReservationRow, steps_of: Callable[[Run], int]) -> DpSgdEvent | ParallelEvent:
    """The job's mechanism: its DP-SGD run, or per label the parallel event of its classes."""
    if not res.per_label:
        return event_of(res, steps_of(res))  # type: ignore[arg-type]
    return ParallelEvent(partitions={p.partition: event_of(p, steps_of(p)) for p in runs(res)})


def _epsilon(run: Run, steps: int, delta: float, discretization: float,
             relation: str | None = None) -> float:
    """A run's standalone epsilon (on a replace-one dataset: its replace-one PLD figure)."""
    return dp_sgd_epsilon(run.noise_multiplier, run.sample_rate, steps, delta, discretization,
                          relation)


def reservation_view(res: ReservationRow, budget: Budget, discretization: float) -> Reservation:
    """The public view of a reservation (per label: each class's run, epsilon = max)."""
    delta, rel = budget.delta, budget.neighbouring
    per_label = None
    if res.per_label:
        sizes = budget.class_sizes or {}
        per_label = {p.partition: LabelReservation(
            event=event_of(p, p.steps_reserved), expected_batch_size=p.expected_batch_size,
            class_size=int(sizes.get(p.partition, 0)), steps_planned=p.steps_planned,
            steps_reserved=p.steps_reserved, steps_granted=p.steps_granted,
            job_epsilon=_epsilon(p, p.steps_reserved, delta, discretization, rel),
            job_epsilon_granted=_epsilon(p, p.steps_granted, delta, discretization, rel),
        ) for p in res.parts}
    reserved = [_epsilon(r, r.steps_reserved, delta, discretization, rel) for r in runs(res)]
    granted = [_epsilon(r, r.steps_granted, delta, discretization, rel) for r in runs(res)]
    return Reservation(
        reservation_id=res.reservation_id, job_id=res.job_id, dataset_id=res.dataset_id,
        state=ReservationState(res.state),
        event=job_event(res, lambda r: r.steps_reserved),
        expected_batch_size=None if res.per_label else res.expected_batch_size,
        steps_planned=None if res.per_label else res.steps_planned,
        steps_reserved=res.steps_reserved, steps_granted=res.steps_granted,
        current_attempt=res.current_attempt,
        job_epsilon=max(reserved, default=0.0),
        job_epsilon_granted=max(granted, default=0.0),
        per_label=per_label,
    )


def released_events(session: Session, dataset_id: str) -> list[DpSgdEvent | GaussianEvent]:
    """The dataset's charged one-shot training releases, from the chain: class-size
    histograms and central-image releases (a Gaussian, or subsampled queries as DP-SGD)."""
    out: list[DpSgdEvent | GaussianEvent] = []
    for e in repo.entries(session, dataset_id=dataset_id):
        if e.kind == "histogram_released":
            out.append(GaussianEvent.model_validate(e.payload["event"]))
        elif e.kind == CENTRAL_IMAGES_RELEASED:
            out.append(central_event(e.payload["event"]))
    return out


def holdout_events(entries: list[Entry]) -> list[GaussianEvent]:
    """The DP evaluations' releases (held-out partition), from the chain. They compose with
    each other only: the held-out records are disjoint from the training records, so the
    dataset's tight figure is the max of the two sides' figures (parallel composition)."""
    return [GaussianEvent.model_validate(e.payload["event"]) for e in entries
            if e.kind == "dp_evaluation_released"]


def _history(entries: list[Entry], tight: TightState) -> list[Charge]:
    """Charges with the filter figure and the tight figure after each entry (the background
    worker's figure of the newest charging entry at or before it; None: not computed yet)."""
    after: float | None = 0.0
    out: list[Charge] = []
    for e in entries:
        p: dict[str, Any] = e.payload
        if released_kind(e) is not None:
            after = tight.after_seq.get(e.seq)
        rdp_delta = max((float(v) for v in p.get("rdp_delta", {}).values()), default=0.0)
        out.append(Charge(
            seq=e.seq, at=e.at, kind=e.kind, job_id=p.get("job_id"),
            reservation_id=p.get("reservation_id"), steps=p.get("steps"), rdp_delta=rdp_delta,
            dataset_epsilon_spent_after=p.get("figures", {}).get("dataset_epsilon_spent"),
            dataset_tight_epsilon_after=after,
        ))
    return out


def budget_view(session: Session, budget: Budget, discretization: float,
                with_history: bool = True, *, inline: bool = False) -> BudgetView:
    """The dataset's budget with its filter figures, the tight figure as far as the
    background worker has computed it (tight.py), and the charge history.

    ``inline`` (tests only) first computes the missing tight figures in this request, in a
    session of its own (the caller's transaction may hold the budget's lock).
    """
    if inline:
        with Session(bind=session.get_bind()) as own:
            while compute_missing(own, discretization, dataset_id=budget.dataset_id):
                pass
    accs = repo.accumulators(session, budget.dataset_id)
    fig = figures(budget, accs)
    f = flt(budget)
    entries = repo.entries(session, dataset_id=budget.dataset_id)
    tight = tight_state(session, entries, budget.dataset_id, discretization)
    warning_fraction = (budget.warning_fraction if budget.warning_fraction is not None
                        else DEFAULT_WARNING_FRACTION)
    history = _history(entries, tight) if with_history else []
    return BudgetView(
        dataset_id=budget.dataset_id, tenant_id=budget.tenant_id,
        epsilon_limit=budget.epsilon_limit, delta=budget.delta,
        neighbouring=Neighbouring(budget.neighbouring), declared_size=budget.declared_size,
        admission_order=budget.admission_order, accountant=ACCOUNTANT_NAME,
        rdp_budget=budget.rdp_budget, rdp_spent=fig["rdp_committed"],
        rdp_reserved=fig["rdp_reserved"],
        dataset_epsilon_spent=fig["dataset_epsilon_spent"],
        dataset_epsilon_reserved=fig["dataset_epsilon_reserved"],
        dataset_epsilon_remaining=fig["dataset_epsilon_remaining"],
        dataset_tight_epsilon=tight.epsilon, dataset_tight_epsilon_as_of=tight.as_of,
        dataset_tight_epsilon_pending=tight.pending,
        partitions={p: a.committed for p, a in sorted(accs.items())},
        class_sizes=dict(budget.class_sizes) if budget.class_sizes is not None else None,
        privacy_unit=PrivacyUnit(budget.privacy_unit or PrivacyUnit.IMAGE),
        partitions_disjoint=bool(budget.partitions_disjoint
                                 if budget.partitions_disjoint is not None else True),
        epsilon_limit_initial=(budget.epsilon_limit_initial
                               if budget.epsilon_limit_initial is not None
                               else initial_limit(session, budget)),
        warning_fraction=warning_fraction,
        warning=is_warning(fig["dataset_epsilon_spent"], budget.epsilon_limit,
                           warning_fraction),
        partition_epsilon_spent={p: f.epsilon(a.committed) for p, a in sorted(accs.items())},
        history=history,
    )


def is_warning(spent: float, limit: float, fraction: float) -> bool:
    """The warning state: the filter figure has reached ``fraction`` of the limit."""
    return spent >= fraction * limit


def initial_limit(session: Session, budget: Budget) -> float:
    """The limit at creation, for budgets created before the column was filled: the one
    its ``budget_created`` entry recorded (the order was chosen from it)."""
    for e in repo.entries(session, dataset_id=budget.dataset_id, limit=1):
        if e.kind == "budget_created":
            return float(e.payload["epsilon_limit"])  # type: ignore[arg-type]
    return budget.epsilon_limit
