"""Bookkeeping on the rows of one dataset, under its budget-row lock.

The committed accumulator only ever grows (``add_up``); the reserved accumulator is recomputed
as the upward-rounded, order-independent sum (``sum_up``) of the open reservations' outstanding
holds, so it returns to exactly 0 when every reservation is closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import ReservationState

from dpsynth_ledger.accounting import HOLDOUT, WHOLE_DATASET, RdpFilter, add_up, sum_up
from dpsynth_ledger.models import Accumulator, Budget, ReservationRow


class Run(Protocol):
    """One DP-SGD run of a reservation: a whole-dataset row, or one class of a per-label one.

    :class:`ReservationRow` (whole dataset, partition ``"*"``) and :class:`ReservationPart`
    (one class) both have these columns, so every charge and hold goes through one code path.
    """

    reservation_id: str
    partition: str
    noise_multiplier: float
    sample_rate: float
    expected_batch_size: int
    steps_reserved: int
    steps_granted: int
    rdp_per_step: float
    rdp_outstanding: float


def runs(res: ReservationRow) -> list[Run]:
    """The reservation's runs: its classes for a per-label job, else the row itself."""
    return list(res.parts) if res.per_label else [res]  # type: ignore[list-item]


def run_of(res: ReservationRow, partition: str | None) -> Run:
    """The run a lease or an extension names (``None`` or ``"*"`` for a whole-dataset job).

    Raises:
        DpsynthError: ``invalid_request`` when the partition does not match the job.
    """
    if not res.per_label:
        if partition not in (None, WHOLE_DATASET):
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               "a whole-dataset reservation takes no partition")
        return res  # type: ignore[return-value]
    for part in res.parts:
        if part.partition == partition:
            return part
    raise DpsynthError(ErrorCode.INVALID_REQUEST,
                       "a per-label reservation needs the partition (class) of its run",
                       partitions=[p.partition for p in res.parts])


def sync_totals(res: ReservationRow) -> None:
    """A per-label row's step counts are the sums over its classes and its outstanding RDP
    the max over them (the most the job may still add to one partition); views only."""
    if res.per_label:
        res.steps_reserved = sum(p.steps_reserved for p in res.parts)
        res.steps_granted = sum(p.steps_granted for p in res.parts)
        res.rdp_outstanding = max((p.rdp_outstanding for p in res.parts), default=0.0)


def flt(budget: Budget) -> RdpFilter:
    """The dataset's filter."""
    return RdpFilter(order=budget.admission_order, rdp_budget=budget.rdp_budget,
                     delta=budget.delta)


def touched(partition: str, partitions: Iterable[str], disjoint: bool = True) -> list[str]:
    """The partitions a run on ``partition`` adds to: all, for a whole-dataset job; its class
    only, for one class of a per-label job on a dataset whose labels are disjoint in the
    privacy unit (parallel composition, McSherry 2009).

    When the labels are NOT disjoint (``disjoint=False``: a subject with images in two
    classes), a class's run may touch any unit of the dataset, so it adds to EVERY partition
    (``"*"`` and every label): a per-label job's classes are summed (sequential composition).

    The held-out partition (:data:`HOLDOUT`) is disjoint from all of them: training runs never
    touch it, and a DP evaluation (``partition == HOLDOUT``) touches it alone.
    """
    if partition == HOLDOUT:  # a DP evaluation: the held-out part only
        return [HOLDOUT]
    names = sorted(p for p in partitions if p != HOLDOUT)  # training never touches it
    return names if partition == WHOLE_DATASET or not disjoint else [partition]


def disjoint_of(budget: Budget) -> bool:
    """The budget's ``partitions_disjoint`` (True for rows from before the column)."""
    return budget.partitions_disjoint is not False


def refresh_reserved(accs: Mapping[str, Accumulator],
                     reservations: Iterable[ReservationRow], disjoint: bool = True) -> None:
    """Set each partition's reserved RDP to the sum of the open reservations' holds on it
    (``disjoint``: the budget's ``partitions_disjoint``, see :func:`touched`)."""
    holds: dict[str, list[float]] = {p: [] for p in accs}
    for res in reservations:
        if res.state == ReservationState.CLOSED:
            continue
        for run in runs(res):
            for p in touched(run.partition, accs, disjoint):
                holds[p].append(run.rdp_outstanding)
    for p, acc in accs.items():
        acc.reserved = sum_up(holds[p])


def charge(accs: Mapping[str, Accumulator], partition: str, amount: float,
           disjoint: bool = True) -> dict[str, float]:
    """Add ``amount`` to the committed RDP of every partition the charge touches
    (:func:`touched`; ``disjoint``: the budget's ``partitions_disjoint``)."""
    delta: dict[str, float] = {}
    for p in touched(partition, accs, disjoint):
        accs[p].committed = add_up(accs[p].committed, amount)
        delta[p] = amount
    return delta


def training_partitions(accs: Mapping[str, Accumulator] | Iterable[str]) -> list[str]:
    """The partitions of the training part: ``"*"`` and every label (not :data:`HOLDOUT`)."""
    return sorted(p for p in accs if p != HOLDOUT)


def labels_of(accs: Mapping[str, Accumulator] | Iterable[str]) -> list[str]:
    """The declared labels: every partition but ``"*"`` and :data:`HOLDOUT`."""
    return [p for p in training_partitions(accs) if p != WHOLE_DATASET]


def snapshot(accs: Mapping[str, Accumulator]) -> dict[str, dict[str, float]]:
    """The accumulators as plain data (for chain payloads)."""
    return {p: {"committed": a.committed, "reserved": a.reserved} for p, a in sorted(accs.items())}


def figures(budget: Budget, accs: Mapping[str, Accumulator]) -> dict[str, Any]:
    """The filter figures of the dataset (max over partitions)."""
    f = flt(budget)
    committed = max((a.committed for a in accs.values()), default=0.0)
    held = max((add_up(a.committed, a.reserved) for a in accs.values()), default=0.0)
    spent = f.epsilon(committed)
    with_reserved = f.epsilon(held)
    return {
        "rdp_committed": committed,
        "rdp_reserved": max((a.reserved for a in accs.values()), default=0.0),
        "rdp_committed_plus_reserved": held,
        "dataset_epsilon_spent": spent,
        "dataset_epsilon_reserved": max(0.0, with_reserved - spent),
        "dataset_epsilon_remaining": max(0.0, budget.epsilon_limit - with_reserved),
    }
