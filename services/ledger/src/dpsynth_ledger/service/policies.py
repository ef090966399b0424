"""Budget policies and audits of one dataset: lower its limit, verify and recompute it.

* :func:`update_limit`: a dataset's epsilon limit is set at creation and only ever LOWERED
  (a raise is 422 ``policy_violation``). The admission order α* stays the one chosen at
  creation (the filter's guarantee is a statement at ONE order fixed in advance); the new RDP
  budget is the named conversion of the new limit at that order. A limit below the figure
  already spent is allowed: it only blocks new work. Each change is a chained entry
  (``limit_lowered``, ``warning_fraction_set``) that :func:`verify_dataset` replays.
* :func:`verify_dataset`: the global chain verification (hashes, links, signatures, charges,
  accumulators) filtered to the dataset's entries, plus every epsilon of the dataset
  recomputed from its entries: each recorded ``figures.dataset_epsilon_spent`` and the
  budget view's filter figure against the replayed accumulators, and each limit change.
* :func:`recompute`: every charge and the filter/tight figures recomputed with the CURRENT
  accountant code next to the recorded ones. A report: it never changes a stored figure and
  never re-admits anything (admission decisions are immutable records).
"""

from __future__ import annotations

import re
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, ParallelEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ledger_contract import (
    BudgetView,
    ChainKey,
    LimitUpdate,
    RecomputedCharge,
    RecomputeReport,
    VerifyReport,
)
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    CONVERSION_NAME,
    WHOLE_DATASET,
    add_up,
    epsilon_to_rdp_budget,
    pld_epsilon,
    rdp_at_order,
    rdp_to_epsilon,
)
from dpsynth_ledger.book import disjoint_of, figures
from dpsynth_ledger.chain import (
    CENTRAL_IMAGES_RELEASED,
    CHAIN_KEY,
    append_entry,
    central_event,
    verify_chain,
)
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget, Entry
from dpsynth_ledger.views import budget_view, holdout_events

LIMIT_LOWERED = "limit_lowered"
WARNING_FRACTION_SET = "warning_fraction_set"
CHARGE_KINDS = frozenset({"lease_granted", "histogram_released", "dp_evaluation_released",
                          CENTRAL_IMAGES_RELEASED, "restored_charge"})

_ENTRY = re.compile(r"^entr(?:y|ies) (\d+)(?:\.\.(\d+))?: (.*)$")
_DATASET = re.compile(r"^dataset (\S+)")


def lowered_rdp_budget(epsilon_limit: float, order: int, delta: float) -> float:
    """The RDP budget of a lowered limit at the dataset's FIXED order (never below 0).

    α* was chosen for the initial limit; at that order the conversion of a much lower limit
    is pessimistic (a dataset created at the lower limit would get a better order and more
    room), so a lowered limit is respected conservatively. An order useless for the new limit
    gives a budget of 0: nothing more is admitted.
    """
    return max(0.0, epsilon_to_rdp_budget(epsilon_limit, order, delta))


def _locked(session: Session, dataset_id: str) -> Budget:
    budget = repo.lock_budget(session, dataset_id)
    if budget is None:
        session.rollback()
        raise NotFound("budget", dataset_id)
    return budget


def update_limit(session: Session, *, dataset_id: str, request: LimitUpdate,
                 ctx: LedgerContext) -> BudgetView:
    """Lower the dataset's epsilon limit and/or set its warning fraction, under its row lock.

    Raises:
        DpsynthError: 404 when there is no budget; 422 ``invalid_request`` for an empty
            body; 422 ``policy_violation`` for a raise (a limit is only ever lowered).
    """
    if request.epsilon_limit is None and request.warning_fraction is None:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "give epsilon_limit (lower only) and/or warning_fraction")
    budget = _locked(session, dataset_id)
    before = budget.epsilon_limit
    if request.epsilon_limit is not None and request.epsilon_limit > before:
        session.rollback()
        raise DpsynthError(
            ErrorCode.POLICY_VIOLATION, f"a dataset's epsilon limit is set at upload and only "
            f"ever lowered: {request.epsilon_limit:g} > the current limit {before:g}",
            epsilon_limit=before, requested_epsilon_limit=request.epsilon_limit)
    accs = repo.accumulators(session, dataset_id)
    if request.epsilon_limit is not None and request.epsilon_limit < before:
        rdp_before = budget.rdp_budget
        budget.epsilon_limit = request.epsilon_limit
        budget.rdp_budget = min(rdp_before, lowered_rdp_budget(
            request.epsilon_limit, budget.admission_order, budget.delta))
        fig = figures(budget, accs)
        append_entry(session, dataset_id=dataset_id, kind=LIMIT_LOWERED, payload={
            "epsilon_limit_before": before, "epsilon_limit": budget.epsilon_limit,
            "rdp_budget_before": rdp_before, "rdp_budget": budget.rdp_budget,
            "admission_order": budget.admission_order, "conversion": CONVERSION_NAME,
            "below_spent": fig["dataset_epsilon_spent"] > budget.epsilon_limit,
            "figures": fig})
    if request.warning_fraction is not None and request.warning_fraction != \
            budget.warning_fraction:
        fraction_before = budget.warning_fraction
        budget.warning_fraction = request.warning_fraction
        append_entry(session, dataset_id=dataset_id, kind=WARNING_FRACTION_SET, payload={
            "warning_fraction_before": fraction_before,
            "warning_fraction": request.warning_fraction})
    session.commit()
    return budget_view(session, budget, ctx.discretization, inline=ctx.tight_inline)


def chain_key(session: Session) -> ChainKey:
    """The chain key's public half, from the session's chain keeper.

    Raises:
        DpsynthError: 404 when this ledger signs no entries (no chain key configured).
    """
    keeper = session.info.get(CHAIN_KEY)
    if keeper is None:
        raise NotFound("chain key", "chain")
    return ChainKey(public_key=keeper.public_key, key_id=keeper.key_id,
                    retired_public_keys=keeper.retired_public_keys)


# -- verification of one dataset ---------------------------------------------------------

class _Figures:
    """The dataset's limit, RDP budget and committed accumulators replayed from its entries."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.order = int(payload["admission_order"])
        self.delta = float(payload["delta"])
        self.limit = float(payload["epsilon_limit"])
        self.rdp_budget = float(payload["rdp_budget"])
        self.committed = {str(p): 0.0 for p in payload["partitions"]}

    def spent(self) -> float:
        return rdp_to_epsilon(max(self.committed.values(), default=0.0), self.order,
                              self.delta)

    def apply(self, entry: Entry, problems: list[str]) -> None:
        p: dict[str, Any] = entry.payload
        delta = p.get("rdp_delta")
        if isinstance(delta, dict) and p.get("decision", "accepted") == "accepted":
            for part, amount in delta.items():
                self.committed[part] = add_up(self.committed.get(part, 0.0), float(amount))
        if entry.kind == LIMIT_LOWERED:
            new = float(p["epsilon_limit"])
            if new > self.limit or float(p.get("epsilon_limit_before", new)) != self.limit:
                problems.append(f"entry {entry.seq}: limit change {p.get('epsilon_limit_before')}"
                                f" -> {new} does not lower the replayed limit {self.limit}")
            if int(p.get("admission_order", self.order)) != self.order:
                problems.append(f"entry {entry.seq}: the admission order changed")
            expected = min(self.rdp_budget, lowered_rdp_budget(new, self.order, self.delta))
            if float(p["rdp_budget"]) != expected:
                problems.append(f"entry {entry.seq}: rdp_budget {p['rdp_budget']} != the "
                                f"conversion of limit {new} at order {self.order}: {expected}")
            self.limit, self.rdp_budget = new, float(p["rdp_budget"])
        recorded = (p.get("figures") or {}).get("dataset_epsilon_spent")
        if recorded is not None and float(recorded) != self.spent():
            problems.append(f"entry {entry.seq}: recorded dataset_epsilon_spent {recorded} != "
                            f"{self.spent()} replayed from the dataset's charges")


def _relevant(problem: str, seqs: set[int], dataset_id: str) -> bool:
    """A global problem that concerns this dataset: one naming its entries or itself, a
    missing entry (it may have been this dataset's) or one that names no entry at all."""
    m = _ENTRY.match(problem)
    if m:
        if "missing" in m.group(3):
            return True
        return int(m.group(1)) in seqs
    d = _DATASET.match(problem)
    if d:
        return d.group(1) == dataset_id
    return True


def verify_dataset(session: Session, *, dataset_id: str, ctx: LedgerContext) -> VerifyReport:
    """The chain verification filtered to the dataset, plus all its epsilons recomputed."""
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    chain = verify_chain(session)
    entries = repo.entries(session, dataset_id=dataset_id)
    seqs = {e.seq for e in entries}
    problems = [p for p in chain.problems if _relevant(p, seqs, dataset_id)]
    replay: _Figures | None = None
    checked = 0
    for entry in entries:
        if entry.kind == "budget_created":
            replay = _Figures(entry.payload)
            if replay.rdp_budget != epsilon_to_rdp_budget(replay.limit, replay.order,
                                                          replay.delta):
                problems.append(f"entry {entry.seq}: rdp_budget is not the conversion of the "
                                "limit at the admission order")
            continue
        if replay is None:
            problems.append(f"entry {entry.seq}: precedes the dataset's budget_created entry")
            continue
        replay.apply(entry, problems)
        recorded: Any = entry.payload.get("figures") or {}
        checked += 1 if recorded.get("dataset_epsilon_spent") is not None else 0
    view = budget_view(session, budget, ctx.discretization, with_history=False,
                       inline=ctx.tight_inline)
    details: dict[str, Any] = {"chain_entries": chain.entries, "dataset_entries": len(entries),
                               "figures_checked": checked,
                               "problems_elsewhere": len(chain.problems) - len(
                                   [p for p in chain.problems if p in problems])}
    if replay is None:
        problems.append(f"dataset {dataset_id}: no budget_created entry")
    else:
        details.update(replayed_limit=replay.limit, replayed_spent=replay.spent())
        if view.dataset_epsilon_spent != replay.spent():
            problems.append(f"dataset {dataset_id}: the view's dataset_epsilon_spent "
                            f"{view.dataset_epsilon_spent} != {replay.spent()} replayed from "
                            "its entries")
        if (budget.epsilon_limit, budget.rdp_budget) != (replay.limit, replay.rdp_budget):
            problems.append(f"dataset {dataset_id}: stored limit {budget.epsilon_limit} / RDP "
                            f"budget {budget.rdp_budget} != replayed {replay.limit} / "
                            f"{replay.rdp_budget}")
    return chain.model_copy(update={"ok": not problems, "entries": len(entries),
                                    "problems": problems,
                                    "details": {**chain.details, **details}})


# -- recomputation with the current code -------------------------------------------------

def recompute_charge(entry: Entry, order: int, relation: str | None = None) -> float | None:
    """The RDP the entry's recorded DP event costs at ``order`` with today's code, on a
    dataset of neighbouring ``relation`` (replace-one: through group privacy)."""
    p: dict[str, Any] = entry.payload
    event = p.get("event")
    if not isinstance(event, dict):
        return None  # e.g. an anchored charge re-applied as recorded (reconciliation)
    try:
        if "noise_multiplier" in event:
            return rdp_at_order(DpSgdEvent.model_validate(event), order, relation)
        return rdp_at_order(GaussianEvent.model_validate(event), order, relation)
    except (KeyError, ValueError):
        return None


def _tight_events(entries: list[Entry]) -> list[DpSgdEvent | GaussianEvent | ParallelEvent]:
    """The realised mechanisms (granted steps per run, one-shot releases) from the entries."""
    granted: dict[tuple[str | None, float, float], int] = {}
    released: list[DpSgdEvent | GaussianEvent | ParallelEvent] = []
    for e in entries:
        p: dict[str, Any] = e.payload
        if e.kind == "lease_granted":
            ev = p["event"]
            key = (p.get("label"), float(ev["noise_multiplier"]), float(ev["sample_rate"]))
            granted[key] = granted.get(key, 0) + int(ev["steps"])
        elif e.kind == "histogram_released":
            released.append(GaussianEvent.model_validate(p["event"]))
        elif e.kind == CENTRAL_IMAGES_RELEASED:  # a whole-dataset training release
            released.append(central_event(p["event"]))
    out: list[DpSgdEvent | GaussianEvent | ParallelEvent] = []
    for (label, sigma, q), steps in granted.items():
        event = DpSgdEvent(noise_multiplier=sigma, sample_rate=q, steps=steps)
        out.append(event if label is None else ParallelEvent(partitions={label: event}))
    return [*out, *released]


def recompute(session: Session, *, dataset_id: str, ctx: LedgerContext) -> RecomputeReport:
    """Every charge and the figures recomputed with the current code; nothing is written."""
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    entries = repo.entries(session, dataset_id=dataset_id)
    created: dict[str, Any] = next((e.payload for e in entries if e.kind == "budget_created"),
                                   {})
    order, delta = budget.admission_order, budget.delta
    committed = {p: 0.0 for p in created.get("partitions", [WHOLE_DATASET])}
    charges: list[RecomputedCharge] = []
    differences: list[str] = []
    for e in entries:
        p: dict[str, Any] = e.payload
        recorded = p.get("rdp_delta")
        if e.kind not in CHARGE_KINDS or not isinstance(recorded, dict):
            continue
        now = recompute_charge(e, order, budget.neighbouring)
        for part, amount in recorded.items():
            committed[part] = add_up(committed.get(part, 0.0),
                                     now if now is not None else float(amount))
        spent_now = rdp_to_epsilon(max(committed.values(), default=0.0), order, delta)
        spent_then = (p.get("figures") or {}).get("dataset_epsilon_spent")
        differs = (now is not None and any(float(v) != now for v in recorded.values())) or (
            spent_then is not None and float(spent_then) != spent_now)
        charges.append(RecomputedCharge(
            seq=e.seq, kind=e.kind, job_id=p.get("job_id"), reservation_id=p.get("reservation_id"),
            recorded_rdp={k: float(v) for k, v in recorded.items()}, recomputed_rdp=now,
            recorded_dataset_epsilon_spent_after=spent_then,
            recomputed_dataset_epsilon_spent_after=spent_now, differs=differs))
        if differs:
            differences.append(f"entry {e.seq} ({e.kind}): recorded RDP {sorted(recorded.values())}"
                               f", spent after {spent_then}; today's code: {now}, {spent_now}")
    accs = repo.accumulators(session, dataset_id)
    fig = figures(budget, accs)
    spent_now = rdp_to_epsilon(max(committed.values(), default=0.0), order, delta)
    if spent_now != fig["dataset_epsilon_spent"]:
        differences.append(f"dataset_epsilon_spent: stored {fig['dataset_epsilon_spent']}, "
                           f"recomputed {spent_now}")
    with ctx.heavy.slot("a recompute report"):  # O(history): an audit, rationed
        tight = max(pld_epsilon(_tight_events(entries), delta, ctx.discretization,
                                dataset=budget.neighbouring, disjoint=disjoint_of(budget)),
                    pld_epsilon(holdout_events(entries), delta, ctx.discretization,
                                dataset=budget.neighbouring))
    return RecomputeReport(
        dataset_id=dataset_id, accountant=ACCOUNTANT_NAME,
        conversion_recorded=created.get("conversion"), conversion=CONVERSION_NAME,
        admission_order=order, delta=delta, epsilon_limit=budget.epsilon_limit,
        charges=charges,
        recorded={"rdp_committed": {p: a.committed for p, a in sorted(accs.items())},
                  "dataset_epsilon_spent": fig["dataset_epsilon_spent"]},
        recomputed={"rdp_committed": dict(sorted(committed.items())),
                    "dataset_epsilon_spent": spent_now, "dataset_tight_epsilon": tight},
        differences=differences)
