"""The tight figure of a dataset's realised sequence, computed in the background.

``dataset_tight_epsilon`` is a PLD composition of everything a dataset has released; its cost
grows with the history, and computing it in every budget view and admission once took most
of an admission's time (issue 14, item 1). It is a report, never a decision (the RDP filter
alone admits: accounting/filter.py), so it does not have to be current: a background thread
of each ledger process computes it after every charging entry and keeps it in
``ledger.tight_figures`` keyed by (dataset, entry seq, PLD interval), shared by every
replica; views show the newest one "as of" the number of charging events it includes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, ParallelEvent
from sqlalchemy import and_, exists, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import ACCOUNTANT_NAME, pld_epsilon
from dpsynth_ledger.book import disjoint_of
from dpsynth_ledger.chain import CENTRAL_IMAGES_RELEASED, RESTORED_CHARGE, central_event
from dpsynth_ledger.models import Budget, Entry, TightFigure

log = logging.getLogger(__name__)

RELEASE_KINDS = ("lease_granted", "histogram_released", "dp_evaluation_released",
                 CENTRAL_IMAGES_RELEASED)
"""The entries that add a mechanism to the realised sequence (one charging event each)."""

TIGHT_KINDS = (*RELEASE_KINDS, RESTORED_CHARGE)
"""Those, and a charge that reconciliation re-applied from the anchor (it names the kind it
restores in ``restored_kind``): a restored charge is part of the sequence like the original."""

BATCH = 50
"""Figures one pass computes at most (newest first), so a backlog never starves a stop."""

FLOOR_MARGIN = 1000
"""Entries below the chain head a pass still looks at once everything was computed (a
write that committed late with a lower seq is not missed); older ones are not scanned."""


@dataclass(frozen=True)
class TightState:
    """What a view shows: the newest computed figure and how many events it includes."""

    epsilon: float | None
    as_of: int | None
    pending: bool
    after_seq: dict[int, float]
    """Each computed charging entry's figure, by its seq (for the charge history)."""


def tight_through(entries: list[Entry], seq: int, budget: Budget,
                  discretization: float) -> tuple[int, float]:
    """(charging events, tight ε) of the dataset's sequence through entry ``seq``.

    DP-SGD steps granted at equal (class, σ, q) merge into one run; a class's lease composes
    only with its class; a central-image release (a Gaussian, or subsampled queries as a
    DP-SGD event) is a whole-dataset training mechanism like a histogram; the held-out
    partition's releases compose with each other only (parallel to the training side), so
    the figure is the max of the two sides.
    """
    granted: dict[tuple[str | None, float, float], int] = {}
    released: list[DpSgdEvent | GaussianEvent] = []
    held_out: list[GaussianEvent] = []
    events = 0
    for e in entries:
        if e.seq > seq:
            break
        p: dict[str, Any] = e.payload
        kind = released_kind(e)
        if kind is None:
            continue
        events += 1
        if kind == "histogram_released":
            released.append(GaussianEvent.model_validate(p["event"]))
        elif kind == CENTRAL_IMAGES_RELEASED:
            released.append(central_event(p["event"]))
        elif kind == "dp_evaluation_released":
            held_out.append(GaussianEvent.model_validate(p["event"]))
        else:
            ev = p["event"]
            key = (p.get("label"), float(ev["noise_multiplier"]), float(ev["sample_rate"]))
            granted[key] = granted.get(key, 0) + int(ev["steps"])
    training: list[DpSgdEvent | GaussianEvent | ParallelEvent] = [*released]
    for (label, sigma, q), steps in granted.items():
        run = DpSgdEvent(noise_multiplier=sigma, sample_rate=q, steps=steps)
        training.append(run if label is None else ParallelEvent(partitions={label: run}))
    relation = budget.neighbouring
    return events, max(pld_epsilon(training, budget.delta, discretization, dataset=relation,
                                   disjoint=disjoint_of(budget)),
                       pld_epsilon(held_out, budget.delta, discretization, dataset=relation))


def released_kind(e: Entry) -> str | None:
    """The release kind an entry adds to the sequence, or None (a restored charge counts as
    the kind it restores; one without its event, from before events were anchored, cannot
    be composed and is left out, as the filter's figures still hold it)."""
    if e.kind in RELEASE_KINDS:
        return e.kind
    if e.kind == RESTORED_CHARGE and e.payload.get("event") is not None:
        restored = e.payload.get("restored_kind")
        return restored if restored in RELEASE_KINDS else None
    return None


def compute_missing(session: Session, discretization: float, *,
                    dataset_id: str | None = None, after_seq: int = 0,
                    limit: int = BATCH) -> int:
    """Compute and keep the figures of up to ``limit`` charging entries after ``after_seq``
    without one (newest first; of one dataset when ``dataset_id`` is given). Returns how
    many were computed.

    Another replica computing the same entry writes the same figure: the first row wins.
    """
    done = exists().where(and_(TightFigure.dataset_id == Entry.dataset_id,
                               TightFigure.seq == Entry.seq,
                               TightFigure.discretization == discretization))
    stmt = (select(Entry.dataset_id, Entry.seq)
            .where(Entry.seq > after_seq, Entry.kind.in_(TIGHT_KINDS), ~done)
            .order_by(Entry.seq.desc()).limit(limit))
    if dataset_id is not None:
        stmt = stmt.where(Entry.dataset_id == dataset_id)
    missing = session.execute(stmt).all()
    by_dataset: dict[str, list[int]] = {}
    for ds, seq in missing:
        by_dataset.setdefault(ds, []).append(seq)
    computed = 0
    for ds, seqs in by_dataset.items():
        budget = repo.get_budget(session, ds)
        if budget is None:
            continue
        entries = repo.entries(session, dataset_id=ds)
        computed += len(seqs)
        for seq in seqs:
            events, epsilon = tight_through(entries, seq, budget, discretization)
            session.execute(insert(TightFigure).values(
                dataset_id=ds, seq=seq, discretization=discretization,
                accountant=ACCOUNTANT_NAME, events=events, epsilon=epsilon,
                computed_at=datetime.now(UTC)).on_conflict_do_nothing())
        session.commit()
    return computed


def tight_state(session: Session, entries: list[Entry], dataset_id: str,
                discretization: float) -> TightState:
    """The newest computed figure of a dataset whose entries (oldest first) are given."""
    charging = [e.seq for e in entries if released_kind(e) is not None]
    if not charging:  # the empty sequence: nothing released, ε = 0, current
        return TightState(epsilon=0.0, as_of=0, pending=False, after_seq={})
    rows = session.execute(
        select(TightFigure.seq, TightFigure.events, TightFigure.epsilon)
        .where(TightFigure.dataset_id == dataset_id,
               TightFigure.discretization == discretization)
        .order_by(TightFigure.seq)).all()
    if not rows:
        return TightState(epsilon=None, as_of=None, pending=True, after_seq={})
    _, events, epsilon = rows[-1]
    return TightState(epsilon=epsilon, as_of=events, pending=events < len(charging),
                      after_seq={s: eps for s, _, eps in rows})


class TightWorker:
    """The background thread that keeps every dataset's tight figure computed.

    Args:
        sessions: the ledger's session factory.
        discretization: the ledger's PLD interval.
        poll_s: the pause between passes that found nothing to do.
    """

    def __init__(self, sessions: sessionmaker[Session], discretization: float,
                 poll_s: float) -> None:
        self.sessions = sessions
        self.discretization = discretization
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._floor = 0  # every charging entry at or below it has its figure
        self._thread = threading.Thread(target=self._run, name="ledger-tight-figures",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.sessions() as session:
                    head = session.scalar(select(func.max(Entry.seq))) or 0
                    computed = compute_missing(session, self.discretization,
                                               after_seq=self._floor)
                if not computed:
                    self._floor = max(self._floor, head - FLOOR_MARGIN)
            except Exception as exc:  # noqa: BLE001 - a report: log, retry next pass
                log.warning("tight figures not computed this pass: %s", type(exc).__name__)
                computed = 0
            if not computed:
                self._stop.wait(self.poll_s)
