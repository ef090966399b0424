"""Prometheus metrics of the ledger: admission and lease counters, and budget figures read
from the database at scrape time.

Two kinds of series:

* **Counters of this process** (reset on restart; ``rate()``/``increase()`` handle that):
  admissions by ``kind`` × ``decision`` × ``reason``, histogram releases, read grants and
  step leases granted, non-DP evaluation reads authorised and their read grants. Every label
  takes a value from a fixed, closed set.
* **Figures read at scrape time** by :class:`BudgetCollector` (one read-only transaction per
  scrape): datasets by state, the distribution of spent fractions, leases active and lapsed,
  open reservations, where the chain stands against its anchor (admissions are refused
  while it is behind), and per-dataset budget gauges for at most ``max_datasets`` datasets
  (those with the highest spent fraction; the rest are only in the aggregates). A restarted
  ledger reports the same figures, and a gauge never goes stale, because nothing is kept in
  memory between scrapes.

Only figures the ledger publishes anyway are exported (limits, the filter's ε spent /
reserved / remaining, the warning fraction, counts): nothing computed from private records.
The one per-object label is ``dataset_id`` (an opaque id, never a name or free text), capped
by ``DPSYNTH_LEDGER_METRICS_MAX_DATASETS``, and off unless an operator sets
``DPSYNTH_LEDGER_METRICS_PER_DATASET=true`` (the app then passes the cap, else 0): it names
every tenant's datasets. See docs/architecture.md ("Metrics").
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from dpsynth_shared.errors import DpsynthError, ErrorCode
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import and_, exists, func, or_, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, aliased, sessionmaker

from dpsynth_ledger.book import figures
from dpsynth_ledger.models import Accumulator, Budget, LeaseRow, ReservationRow

P = ParamSpec("P")
R = TypeVar("R")

ADMISSION_KINDS = ("reservation", "extension", "histogram", "dp_evaluation", "central_images")
"""What was admitted: a job's reservation, an extension of one, a class-size histogram, a DP
evaluation release (charged to the held-out partition), a finetune's central-image release
(charged to every training partition)."""

REFUSAL_REASONS: dict[ErrorCode, str] = {
    ErrorCode.PRIVACY_BUDGET_EXHAUSTED: "budget_exhausted",
    ErrorCode.UNSUPPORTED_NEIGHBOURING: "unsupported_neighbouring",
    ErrorCode.LEDGER_BEHIND_ANCHOR: "behind_anchor",
    ErrorCode.POLICY_VIOLATION: "other",
    ErrorCode.DATASET_DELETED: "other",
}
"""Error codes that are admission decisions, and their ``reason`` label. Other errors of an
admission call (malformed request, unknown dataset, stale attempt) decide nothing and are not
counted as refusals."""

REASONS = ("none", "budget_exhausted", "unsupported_neighbouring", "behind_anchor", "other")
"""Every value of the ``reason`` label (``none`` for an accepted admission)."""

STATES = ("ok", "warning", "exhausted")
"""Every value of the ``state`` label of ``dpsynth_ledger_datasets``."""

SPENT_FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""Upper bounds of the spent-fraction gauge histogram (``+Inf`` is added)."""

EXHAUSTED_TOLERANCE = 1e-6
"""A dataset is exhausted when less than this fraction of its limit remains (the filter's
ε of a full RDP budget falls a few ulps below the limit, never exactly on it)."""

ANCHOR_STATES = ("current", "behind", "diverged", "unreadable")
"""Every value of the ``state`` label of ``dpsynth_ledger_anchor_state``."""

SCRAPE_STATEMENT_TIMEOUT_MS = 5000
"""A scrape never holds a database connection longer than this."""

DEFAULT_MAX_DATASETS = 100


@dataclass(frozen=True)
class DatasetFigures:
    """The published figures of one dataset's budget (filter figures, max over partitions)."""

    dataset_id: str
    epsilon_limit: float
    epsilon_spent: float
    epsilon_reserved: float
    epsilon_remaining: float
    warning_fraction: float

    @property
    def spent_fraction(self) -> float:
        """Spent over limit (1 for a non-positive limit)."""
        return self.epsilon_spent / self.epsilon_limit if self.epsilon_limit > 0 else 1.0

    @property
    def warning(self) -> bool:
        """Spent has reached the dataset's warning threshold (BudgetView.warning)."""
        return self.epsilon_spent >= self.warning_fraction * self.epsilon_limit

    @property
    def state(self) -> str:
        """``exhausted`` (no room for any new admission), ``warning`` or ``ok``."""
        if self.epsilon_remaining <= EXHAUSTED_TOLERANCE * self.epsilon_limit:
            return "exhausted"
        return "warning" if self.warning else "ok"


@dataclass(frozen=True)
class Snapshot:
    """What one scrape read from the database."""

    datasets: Sequence[DatasetFigures]
    leases_total: int
    leases_active: int
    leases_lapsed: int
    reservations_open: int
    anchor_state: str | None = None
    """One of :data:`ANCHOR_STATES`, or None when the anchor is not checked."""


AnchorCheck = Callable[[Session], Any]
"""Reads where the database's head stands against the anchor: returns an object with
``behind`` and ``diverged`` (``AnchorStatus``) or raises when the anchor is unreadable."""


def anchor_state(session: Session, check: AnchorCheck) -> str:
    """``current``, ``behind``, ``diverged`` or ``unreadable`` (the ledger refuses every
    write in the last three until reconciliation or until the anchor can be read)."""
    try:
        status = check(session)
    except Exception:  # noqa: BLE001 - any failure to read the anchor reads as unreadable
        return "unreadable"
    if status.diverged:
        return "diverged"
    return "behind" if status.behind else "current"


def read_snapshot(session: Session, now: datetime | None = None,
                  anchor: AnchorCheck | None = None) -> Snapshot:
    """Read every budget's figures and the lease counts in one read-only snapshot.

    A lease has lapsed when its TTL passed while it was still the reservation's current
    lease: not ended before ``expires_at``, not superseded by a later lease of the same
    reservation and partition granted before ``expires_at``, and its reservation not closed
    before ``expires_at``. That is a holder that stopped heartbeating; a worker that goes on to
    its next lease or finishes the job leaves its used-up lease unended, and that is not a
    lapse. The set only grows, so its size is a counter that survives restarts.
    """
    session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
    session.execute(text(f"SET LOCAL statement_timeout = {SCRAPE_STATEMENT_TIMEOUT_MS}"))
    now = now or datetime.now(UTC)
    accs: dict[str, list[Accumulator]] = {}
    for acc in session.execute(select(Accumulator)).scalars():
        accs.setdefault(acc.dataset_id, []).append(acc)
    datasets = []
    for budget in session.execute(select(Budget)).scalars():
        fig = figures(budget, {a.partition: a for a in accs.get(budget.dataset_id, [])})
        datasets.append(_figures_of(budget, fig))
    later = aliased(LeaseRow)
    superseded = exists().where(
        later.reservation_id == LeaseRow.reservation_id,
        later.partition.is_not_distinct_from(LeaseRow.partition),
        later.granted_at > LeaseRow.granted_at,
        later.granted_at <= LeaseRow.expires_at)
    closed_in_time = exists().where(
        ReservationRow.reservation_id == LeaseRow.reservation_id,
        ReservationRow.closed_at.is_not(None),
        ReservationRow.closed_at <= LeaseRow.expires_at)
    lapsed = and_(LeaseRow.expires_at < now,
                  or_(LeaseRow.ended_at.is_(None), LeaseRow.ended_at > LeaseRow.expires_at),
                  ~superseded, ~closed_in_time)
    active = and_(LeaseRow.expires_at >= now, LeaseRow.ended_at.is_(None), ~superseded,
                  ~closed_in_time)
    row = session.execute(select(
        func.count(), func.count().filter(active), func.count().filter(lapsed),
    ).select_from(LeaseRow)).one()
    open_ = session.execute(select(func.count()).select_from(ReservationRow)
                            .where(ReservationRow.state != "closed")).scalar_one()
    return Snapshot(datasets=datasets, leases_total=int(row[0]), leases_active=int(row[1]),
                    leases_lapsed=int(row[2]), reservations_open=int(open_),
                    anchor_state=None if anchor is None else anchor_state(session, anchor))


def _figures_of(budget: Budget, fig: dict[str, Any]) -> DatasetFigures:
    return DatasetFigures(
        dataset_id=budget.dataset_id, epsilon_limit=float(budget.epsilon_limit),
        epsilon_spent=float(fig["dataset_epsilon_spent"]),
        epsilon_reserved=float(fig["dataset_epsilon_reserved"]),
        epsilon_remaining=float(fig["dataset_epsilon_remaining"]),
        warning_fraction=float(budget.warning_fraction))


def _per_dataset(datasets: Sequence[DatasetFigures], cap: int) -> list[DatasetFigures]:
    """The ``cap`` datasets closest to their limit (highest spent fraction, then id)."""
    ranked = sorted(datasets, key=lambda d: (-d.spent_fraction, d.dataset_id))
    return ranked[:cap]


PER_DATASET = {
    "epsilon_limit": "The dataset's epsilon limit (only ever lowered)",
    "epsilon_spent": "Filter epsilon of the committed RDP (granted steps, releases)",
    "epsilon_reserved": "Filter epsilon added by open reservations' holds",
    "epsilon_remaining": "Limit minus the filter epsilon of committed + reserved",
    "warning_fraction": "Fraction of the limit at which the dataset warns",
    "budget_warning": "1 when epsilon spent >= warning_fraction * limit",
}


def families(snapshot: Snapshot, max_datasets: int) -> list[Metric]:
    """The scrape-time metric families of a snapshot (pure; see the module docstring)."""
    out: list[Metric] = []
    by_state = GaugeMetricFamily("dpsynth_ledger_datasets", "Datasets by budget state "
                                 "(ok, warning: spent >= warning fraction, exhausted: no room)",
                                 labels=["state"])
    counts = dict.fromkeys(STATES, 0)
    for d in snapshot.datasets:
        counts[d.state] += 1
    for state in STATES:
        by_state.add_metric([state], counts[state])
    out.append(by_state)
    cumulative: list[tuple[str, float]] = []
    for bound in SPENT_FRACTION_BUCKETS:
        cumulative.append((str(bound), sum(d.spent_fraction <= bound for d in snapshot.datasets)))
    cumulative.append(("+Inf", len(snapshot.datasets)))
    total_fraction = sum(d.spent_fraction for d in snapshot.datasets)
    out.append(GaugeHistogramMetricFamily(
        "dpsynth_ledger_datasets_spent_fraction",
        "Datasets by epsilon spent / epsilon limit (cumulative buckets)",
        buckets=cumulative, gsum_value=total_fraction))
    shown = _per_dataset(snapshot.datasets, max_datasets)
    out.append(GaugeMetricFamily(
        "dpsynth_ledger_datasets_omitted",
        "Datasets left out of the per-dataset series by the cap (only in the aggregates)",
        value=len(snapshot.datasets) - len(shown)))
    gauges = {key: GaugeMetricFamily(f"dpsynth_ledger_dataset_{key}", doc,
                                     labels=["dataset_id"]) for key, doc in PER_DATASET.items()}
    for d in shown:
        values = {"epsilon_limit": d.epsilon_limit, "epsilon_spent": d.epsilon_spent,
                  "epsilon_reserved": d.epsilon_reserved,
                  "epsilon_remaining": d.epsilon_remaining,
                  "warning_fraction": d.warning_fraction,
                  "budget_warning": 1.0 if d.warning else 0.0}
        for key, value in values.items():
            gauges[key].add_metric([d.dataset_id], value)
    out.extend(gauges.values())
    out.append(GaugeMetricFamily("dpsynth_ledger_leases_active",
                                 "Step leases that are their reservation's current one and "
                                 "neither ended nor past their expiry",
                                 value=snapshot.leases_active))
    out.append(CounterMetricFamily("dpsynth_ledger_leases_expired",
                                   "Step leases whose TTL passed while they were their "
                                   "reservation's current one, not ended (a lost holder) "
                                   "(read from the database: survives restarts)",
                                   value=snapshot.leases_lapsed))
    out.append(CounterMetricFamily("dpsynth_ledger_leases_recorded",
                                   "Step leases in the ledger's database (all time)",
                                   value=snapshot.leases_total))
    out.append(GaugeMetricFamily("dpsynth_ledger_reservations_open",
                                 "Reservations not closed (open or touched)",
                                 value=snapshot.reservations_open))
    if snapshot.anchor_state is not None:
        anchored = GaugeMetricFamily(
            "dpsynth_ledger_anchor_state", "1 for where the database's chain head stands "
            "against the anchored head (behind, diverged, unreadable: admissions refused)",
            labels=["state"])
        for state in ANCHOR_STATES:
            anchored.add_metric([state], 1.0 if state == snapshot.anchor_state else 0.0)
        out.append(anchored)
    return out


class BudgetCollector(Collector):
    """Reads the budget figures from the database on every scrape (never cached).

    A failed read (database down, statement timeout) yields
    ``dpsynth_ledger_metrics_scrape_error 1`` and no figures, instead of failing the scrape.
    """

    def __init__(self, sessions: sessionmaker[Session], max_datasets: int,
                 anchor: AnchorCheck | None = None) -> None:
        self._sessions = sessions
        self._max = max_datasets
        self._anchor = anchor

    def describe(self) -> Iterable[Metric]:
        """Every family this collector exports (names only; no database read)."""
        empty = Snapshot(datasets=(), leases_total=0, leases_active=0, leases_lapsed=0,
                         reservations_open=0, anchor_state="current")
        return [*families(empty, self._max), *self._status(ok=True, seconds=0.0)]

    def collect(self) -> Iterator[Metric]:
        """Read the figures now and yield them."""
        started = time.perf_counter()
        try:
            with self._sessions() as session:
                snapshot = read_snapshot(session, anchor=self._anchor)
                session.rollback()
        except SQLAlchemyError:
            yield from self._status(ok=False, seconds=time.perf_counter() - started)
            return
        yield from families(snapshot, self._max)
        yield from self._status(ok=True, seconds=time.perf_counter() - started)

    @staticmethod
    def _status(*, ok: bool, seconds: float) -> list[Metric]:
        return [GaugeMetricFamily("dpsynth_ledger_metrics_scrape_error",
                                  "1 when the last scrape could not read the database",
                                  value=0.0 if ok else 1.0),
                GaugeMetricFamily("dpsynth_ledger_metrics_scrape_duration_seconds",
                                  "Time the last scrape spent reading the database",
                                  value=seconds)]


class LedgerMetrics:
    """The ledger's registry: in-process counters, plus :class:`BudgetCollector` once
    :meth:`track_budgets` has given it the database."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "dpsynth_ledger_admissions", "Admission decisions of the ledger (through the RDP "
            "filter or refused before it)", ["kind", "decision", "reason"],
            registry=self.registry)
        self.histogram_releases = Counter("dpsynth_ledger_histogram_releases",
                                          "Class-size histograms released (charged)",
                                          registry=self.registry)
        self.read_grants = Counter("dpsynth_ledger_read_grants", "Read grants issued",
                                   registry=self.registry)
        self.leases = Counter("dpsynth_ledger_leases_granted", "Step leases granted (charged)",
                              registry=self.registry)
        self.evaluations_authorised = Counter(
            "dpsynth_ledger_evaluations_authorised", "Non-DP evaluation reads of private data "
            "authorised (recorded in the chain, no epsilon charged)", registry=self.registry)
        self.evaluation_reads = Counter(
            "dpsynth_ledger_evaluation_reads", "Read grants issued for non-DP evaluation reads "
            "of private data (recorded in the chain, no epsilon charged)",
            registry=self.registry)
        for kind in ADMISSION_KINDS:  # every series exists from the start (rate() of zero)
            self.admissions.labels(kind=kind, decision="accepted", reason="none")
            for reason in REASONS[1:]:
                self.admissions.labels(kind=kind, decision="refused", reason=reason)
        self.budgets: BudgetCollector | None = None

    def track_budgets(self, sessions: sessionmaker[Session],
                      max_datasets: int = DEFAULT_MAX_DATASETS,
                      anchor: AnchorCheck | None = None) -> None:
        """Export the scrape-time figures read through ``sessions`` (and, given ``anchor``,
        where the chain stands against its anchor)."""
        self.budgets = BudgetCollector(sessions, max_datasets, anchor)
        self.registry.register(self.budgets)

    def accepted(self, kind: str) -> None:
        """Count an accepted admission of ``kind`` (one of :data:`ADMISSION_KINDS`)."""
        self.admissions.labels(kind=kind, decision="accepted", reason="none").inc()

    def refused(self, kind: str, err: DpsynthError) -> None:
        """Count ``err`` as a refused admission if its code is an admission decision."""
        reason = REFUSAL_REASONS.get(err.code) if isinstance(err.code, ErrorCode) else None
        if reason is not None:
            self.admissions.labels(kind=kind, decision="refused", reason=reason).inc()


def counts_refusals(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate an admission use case so that each refusal it raises is counted.

    The use case takes ``ctx`` (with ``.metrics``) and ``request`` as keywords; a
    ``dry_run`` request decides nothing and is not counted. Accepted admissions are counted
    where they commit (``ctx.metrics.accepted``), since an idempotent repeat returns the
    earlier decision without a new one.
    """
    if kind not in ADMISSION_KINDS:
        raise ValueError(f"unknown admission kind {kind!r}")

    def wrap(use_case: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(use_case)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return use_case(*args, **kwargs)
            except DpsynthError as err:
                metrics = getattr(kwargs.get("ctx"), "metrics", None)
                dry_run = getattr(kwargs.get("request"), "dry_run", False)
                if isinstance(metrics, LedgerMetrics) and not dry_run:
                    metrics.refused(kind, err)
                raise
        return counted
    return wrap
