"""Response bodies built from rows (figures recomputed from the accumulators)."""

from __future__ import annotations

from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent, Neighbouring
from dpsynth_shared.ledger_contract import BudgetView, Charge, Reservation, ReservationState
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import ACCOUNTANT_NAME, dp_sgd_epsilon, pld_epsilon
from dpsynth_ledger.book import figures
from dpsynth_ledger.models import Budget, Entry, ReservationRow


def event_of(res: ReservationRow, steps: int) -> DpSgdEvent:
    """The reservation's mechanism with ``steps`` steps."""
    return DpSgdEvent(noise_multiplier=res.noise_multiplier, sample_rate=res.sample_rate,
                      steps=steps)


def reservation_view(res: ReservationRow, delta: float, discretization: float) -> Reservation:
    """The public view of a reservation."""
    return Reservation(
        reservation_id=res.reservation_id, job_id=res.job_id, dataset_id=res.dataset_id,
        state=ReservationState(res.state), event=event_of(res, res.steps_reserved),
        expected_batch_size=res.expected_batch_size, steps_reserved=res.steps_reserved,
        steps_granted=res.steps_granted, current_attempt=res.current_attempt,
        job_epsilon=dp_sgd_epsilon(res.noise_multiplier, res.sample_rate, res.steps_reserved,
                                   delta, discretization),
        job_epsilon_granted=dp_sgd_epsilon(res.noise_multiplier, res.sample_rate,
                                           res.steps_granted, delta, discretization),
    )


def granted_events(reservations: list[ReservationRow]) -> list[DpSgdEvent]:
    """The DP events actually granted (what ran or may have run)."""
    return [event_of(r, r.steps_granted) for r in reservations if r.steps_granted]


def _history(entries: list[Entry], delta: float, discretization: float) -> list[Charge]:
    """Charges with the filter figure and the tight figure after each entry."""
    granted: dict[tuple[float, float], int] = {}
    tight = 0.0
    out: list[Charge] = []
    for e in entries:
        p: dict[str, Any] = e.payload
        if e.kind == "lease_granted":
            ev = p["event"]
            key = (float(ev["noise_multiplier"]), float(ev["sample_rate"]))
            granted[key] = granted.get(key, 0) + int(ev["steps"])
            tight = pld_epsilon([DpSgdEvent(noise_multiplier=s, sample_rate=q, steps=n)
                                 for (s, q), n in granted.items()], delta, discretization)
        rdp_delta = max((float(v) for v in p.get("rdp_delta", {}).values()), default=0.0)
        out.append(Charge(
            seq=e.seq, at=e.at, kind=e.kind, job_id=p.get("job_id"),
            reservation_id=p.get("reservation_id"), steps=p.get("steps"), rdp_delta=rdp_delta,
            dataset_epsilon_spent_after=p.get("figures", {}).get("dataset_epsilon_spent"),
            dataset_tight_epsilon_after=tight,
        ))
    return out


def budget_view(session: Session, budget: Budget, discretization: float,
                with_history: bool = True) -> BudgetView:
    """The dataset's budget with its filter and tight figures (and charge history)."""
    accs = repo.accumulators(session, budget.dataset_id)
    fig = figures(budget, accs)
    reservations = repo.reservations_of(session, budget.dataset_id)
    tight = pld_epsilon(granted_events(reservations), budget.delta, discretization)
    history = (_history(repo.entries(session, dataset_id=budget.dataset_id), budget.delta,
                        discretization) if with_history else [])
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
        dataset_tight_epsilon=tight,
        partitions={p: a.committed for p, a in sorted(accs.items())},
        history=history,
    )
