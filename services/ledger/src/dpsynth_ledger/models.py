"""SQLAlchemy tables of schema ``ledger`` (the metadata Alembic's env.py compares with)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

SCHEMA = "ledger"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Budget(Base):
    """A private dataset's budget; its row is the lock every write on the dataset takes."""

    __tablename__ = "budgets"

    dataset_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    epsilon_limit: Mapped[float] = mapped_column(Double)
    delta: Mapped[float] = mapped_column(Double)
    declared_size: Mapped[int] = mapped_column(BigInteger)
    neighbouring: Mapped[str] = mapped_column(String(16))
    admission_order: Mapped[int] = mapped_column(Integer)
    rdp_budget: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Public per-class sizes N̂_c declared by the owner (per-label jobs); None: not declared.
    class_sizes: Mapped[dict[str, int] | None] = mapped_column(JSONB, nullable=True)
    # "image" or "subject" (user-level DP: N̂ and q count subjects).
    privacy_unit: Mapped[str] = mapped_column(String(10), default="image",
                                              server_default="image")
    # Every unit falls in one declared label: per-label jobs compose in parallel (else summed).
    partitions_disjoint: Mapped[bool] = mapped_column(Boolean, default=True,
                                                      server_default=true())
    warning_fraction: Mapped[float] = mapped_column(Double, default=0.8, server_default="0.8")
    # The limit at creation (the admission order was chosen from it); epsilon_limit only falls.
    epsilon_limit_initial: Mapped[float | None] = mapped_column(Double, nullable=True)


class Accumulator(Base):
    """RDP at the admission order per partition: committed (never decreases) and reserved."""

    __tablename__ = "accumulators"

    dataset_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("ledger.budgets.dataset_id"), primary_key=True)
    partition: Mapped[str] = mapped_column(String(200), primary_key=True)
    committed: Mapped[float] = mapped_column(Double, default=0.0)
    reserved: Mapped[float] = mapped_column(Double, default=0.0)


class ReservationRow(Base):
    """An admitted DP-SGD job: the steps it may run, how many were granted, its attempt fence.

    A whole-dataset job (``per_label`` false) is one DP-SGD run on partition ``"*"``, described
    by the row's own columns. A per-label job is one row (one admission, one id, one attempt
    fence) whose runs are its :class:`ReservationPart` rows, one per class; its own DP columns
    are NULL, its step counts are the sums over the parts and its ``partition`` is ``""``.
    """

    __tablename__ = "reservations"
    __table_args__ = (UniqueConstraint("job_id", name="uq_reservations_job_id"),)

    reservation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64))
    dataset_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("ledger.budgets.dataset_id"), index=True)
    partition: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    noise_multiplier: Mapped[float | None] = mapped_column(Double, nullable=True)
    sample_rate: Mapped[float | None] = mapped_column(Double, nullable=True)
    expected_batch_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    target_epsilon: Mapped[float] = mapped_column(Double)
    steps_planned: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    steps_reserved: Mapped[int] = mapped_column(BigInteger)
    steps_granted: Mapped[int] = mapped_column(BigInteger, default=0)
    current_attempt: Mapped[int] = mapped_column(Integer, default=0)
    rdp_per_step: Mapped[float | None] = mapped_column(Double, nullable=True)
    rdp_outstanding: Mapped[float] = mapped_column(Double)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    per_label: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    parts: Mapped[list[ReservationPart]] = relationship(
        lazy="selectin", order_by="ReservationPart.partition", cascade="all, delete-orphan")


class ReservationPart(Base):
    """One class's DP-SGD run inside a per-label reservation (steps counted from 0)."""

    __tablename__ = "reservation_parts"

    reservation_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("ledger.reservations.reservation_id"), primary_key=True)
    partition: Mapped[str] = mapped_column(String(200), primary_key=True)
    noise_multiplier: Mapped[float] = mapped_column(Double)
    sample_rate: Mapped[float] = mapped_column(Double)
    expected_batch_size: Mapped[int] = mapped_column(Integer)
    steps_planned: Mapped[int] = mapped_column(BigInteger)
    steps_reserved: Mapped[int] = mapped_column(BigInteger)
    steps_granted: Mapped[int] = mapped_column(BigInteger, default=0)
    rdp_per_step: Mapped[float] = mapped_column(Double)
    rdp_outstanding: Mapped[float] = mapped_column(Double)


class LeaseRow(Base):
    """Steps [start_step, start_step + steps) granted (and charged) to one attempt."""

    __tablename__ = "leases"

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    reservation_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("ledger.reservations.reservation_id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    start_step: Mapped[int] = mapped_column(BigInteger)
    steps: Mapped[int] = mapped_column(BigInteger)
    partition: Mapped[str | None] = mapped_column(String(200), nullable=True)
    granted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Entry(Base):
    """One hash-chained, append-only ledger entry (a trigger refuses UPDATE and DELETE)."""

    __tablename__ = "entries"

    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    dataset_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, object]] = mapped_column(JSONB)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    # Ed25519 signature of signed_message(seq, hash) by the chain key (None: before 0004).
    signature: Mapped[str | None] = mapped_column(Text, nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ChainHead(Base):
    """The one-row head of the global chain; locked (after the budget row) by every write."""

    __tablename__ = "chain_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(Text)


class EvaluationRow(Base):
    """A non-DP evaluation read authorised on a budget (no epsilon: recorded, never charged).

    One row per evaluate job (``job_id`` unique: authorisation is idempotent); ``grants``
    counts the read grants a worker took for it, ``touched_at`` is the first one's time.
    """

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("job_id", name="uq_evaluations_job_id"),)

    evaluation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("ledger.budgets.dataset_id"), index=True)
    job_id: Mapped[str] = mapped_column(String(64))
    reference_dataset_id: Mapped[str] = mapped_column(String(64))
    requested_by: Mapped[str] = mapped_column(String(64))
    purpose: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    touched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    grants: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class CalibrationRow(Base):
    """A calibrated σ of one job shape, shared by every ledger process (a cache: derived,
    never part of the chain). ``shape`` is the canonical key of all the other key columns."""

    __tablename__ = "calibrations"

    shape: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    target_epsilon: Mapped[float] = mapped_column(Double)
    sample_rate: Mapped[float] = mapped_column(Double)
    steps: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[float] = mapped_column(Double)
    relation: Mapped[str] = mapped_column(String(16))
    discretization: Mapped[float] = mapped_column(Double)
    accountant: Mapped[str] = mapped_column(Text)
    sigma: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class TightFigure(Base):
    """The tight PLD figure of a dataset's realised sequence through chain entry ``seq``
    (``events`` charging events), computed in the background (a cache: derived, never part
    of the chain; the filter alone admits)."""

    __tablename__ = "tight_figures"

    dataset_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    discretization: Mapped[float] = mapped_column(Double, primary_key=True)
    accountant: Mapped[str] = mapped_column(Text)
    events: Mapped[int] = mapped_column(Integer)
    epsilon: Mapped[float] = mapped_column(Double)
    computed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
