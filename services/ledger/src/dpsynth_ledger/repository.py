"""SQL of the ledger. Functions take a Session, ``flush()`` at most; the use case commits once.

Lock order (no deadlocks): the dataset's budget row first (:func:`lock_budget`), then the
chain head (:func:`lock_chain_head`, taken by ``chain.append_entry``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_ledger.models import (
    Accumulator,
    Budget,
    ChainHead,
    Entry,
    LeaseRow,
    ReservationRow,
)


def get_budget(session: Session, dataset_id: str) -> Budget | None:
    """The budget row, unlocked (for reads and for computations outside the lock)."""
    return session.get(Budget, dataset_id)


def lock_budget(session: Session, dataset_id: str) -> Budget | None:
    """``SELECT … FOR UPDATE`` on the dataset's budget row (the first lock of every write)."""
    stmt = select(Budget).where(Budget.dataset_id == dataset_id).with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def insert_budget(session: Session, budget: Budget, partitions: Sequence[str]) -> None:
    """Insert a budget and one zeroed accumulator per partition."""
    session.add(budget)
    session.flush()
    for name in partitions:
        session.add(Accumulator(dataset_id=budget.dataset_id, partition=name,
                                committed=0.0, reserved=0.0))
    session.flush()


def accumulators(session: Session, dataset_id: str) -> dict[str, Accumulator]:
    """The dataset's accumulators by partition name."""
    stmt = select(Accumulator).where(Accumulator.dataset_id == dataset_id)
    return {a.partition: a for a in session.execute(stmt).scalars()}


def get_reservation(session: Session, reservation_id: str) -> ReservationRow | None:
    """A reservation by id (read under the budget lock when it is about to change)."""
    return session.get(ReservationRow, reservation_id, populate_existing=True)


def get_reservation_by_job(session: Session, job_id: str) -> ReservationRow | None:
    """The reservation of a job (reservations are idempotent on ``job_id``)."""
    stmt = select(ReservationRow).where(ReservationRow.job_id == job_id)
    return session.execute(stmt).scalar_one_or_none()


def reservations_of(session: Session, dataset_id: str,
                    ids: Sequence[str] | None = None) -> list[ReservationRow]:
    """The dataset's reservations (optionally only ``ids``), oldest first."""
    stmt = select(ReservationRow).where(ReservationRow.dataset_id == dataset_id)
    if ids is not None:
        stmt = stmt.where(ReservationRow.reservation_id.in_(list(ids)))
    stmt = stmt.order_by(ReservationRow.created_at, ReservationRow.reservation_id)
    return list(session.execute(stmt).scalars())


def add(session: Session, row: ReservationRow | LeaseRow) -> None:
    """Insert a reservation or lease row."""
    session.add(row)
    session.flush()


def get_lease(session: Session, lease_id: str) -> LeaseRow | None:
    """A lease by id."""
    return session.get(LeaseRow, lease_id)


def last_lease(session: Session, reservation_id: str) -> LeaseRow | None:
    """The most recently granted lease of a reservation."""
    stmt = (select(LeaseRow).where(LeaseRow.reservation_id == reservation_id)
            .order_by(LeaseRow.granted_at.desc()).limit(1))
    return session.execute(stmt).scalar_one_or_none()


def lock_chain_head(session: Session) -> ChainHead:
    """``SELECT … FOR UPDATE`` on the one-row chain head (always after the budget row)."""
    stmt = select(ChainHead).where(ChainHead.id == 1).with_for_update()
    return session.execute(stmt).scalar_one()


def insert_entry(session: Session, head: ChainHead, *, seq: int, at: datetime, dataset_id: str,
                 kind: str, payload: dict[str, object], prev_hash: str, digest: str,
                 signature: str | None = None, key_id: str | None = None) -> Entry:
    """Append one entry (with its chain-key signature) and move the head to it."""
    entry = Entry(seq=seq, at=at, dataset_id=dataset_id, kind=kind, payload=payload,
                  prev_hash=prev_hash, hash=digest, signature=signature, key_id=key_id)
    session.add(entry)
    head.seq, head.hash = seq, digest
    session.flush()
    return entry


def entries(session: Session, *, dataset_id: str | None = None, after_seq: int = 0,
            limit: int | None = None) -> list[Entry]:
    """Entries in chain order (optionally of one dataset, after a sequence number)."""
    stmt = select(Entry).where(Entry.seq > after_seq).order_by(Entry.seq)
    if dataset_id is not None:
        stmt = stmt.where(Entry.dataset_id == dataset_id)
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(session.execute(stmt).scalars())


def chain_head(session: Session) -> ChainHead:
    """The chain head, unlocked."""
    return session.execute(select(ChainHead).where(ChainHead.id == 1)).scalar_one()


def all_budgets(session: Session) -> list[Budget]:
    """Every budget (for verification and metrics)."""
    return list(session.execute(select(Budget).order_by(Budget.dataset_id)).scalars())
