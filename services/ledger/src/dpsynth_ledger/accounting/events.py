"""Mapping of dpsynth's DP events onto Google ``dp_accounting`` events, in one place.

Our events (:mod:`dpsynth_shared.dp_events`) are the unit of record; this module is the only
translation to the accountant library, so every figure the ledger reports (filter, PLD) is
computed from the same mechanism description.
"""

from __future__ import annotations

from collections.abc import Iterable

import dp_accounting
from dpsynth_shared.dp_events import (
    DpEvent,
    DpSgdEvent,
    GaussianEvent,
    Neighbouring,
    ParallelEvent,
)
from dpsynth_shared.errors import DpsynthError, ErrorCode

WHOLE_DATASET = "*"
"""Name of the partition that every whole-dataset event enters (besides every label)."""


def to_dp_accounting(event: DpSgdEvent | GaussianEvent) -> dp_accounting.DpEvent:
    """Translate one (non-parallel) dpsynth event into a ``dp_accounting`` event.

    A DP-SGD run is ``steps`` self-compositions of a Poisson-subsampled Gaussian
    (Abadi et al. 2016; Mironov, Talwar & Zhang 2019, "Rényi DP of the Sampled Gaussian
    Mechanism"); a one-shot Gaussian release of L2 sensitivity ``s`` with noise std ``sigma``
    is a Gaussian with noise multiplier ``sigma / s``.

    Args:
        event: a :class:`DpSgdEvent` or :class:`GaussianEvent`.

    Returns:
        The equivalent ``dp_accounting`` event (``NoOpDpEvent`` for zero steps).

    Raises:
        DpsynthError: ``invalid_request`` for a :class:`ParallelEvent` (split it first with
            :func:`partition_events`).
    """
    if isinstance(event, DpSgdEvent):
        if event.steps == 0:
            return dp_accounting.NoOpDpEvent()
        step = dp_accounting.PoissonSampledDpEvent(
            event.sample_rate, dp_accounting.GaussianDpEvent(event.noise_multiplier)
        )
        return dp_accounting.SelfComposedDpEvent(step, event.steps)
    if isinstance(event, GaussianEvent):
        return dp_accounting.GaussianDpEvent(event.sigma / event.sensitivity)
    raise DpsynthError(ErrorCode.INVALID_REQUEST,
                       "a parallel event must be split into its partitions first")


def partition_events(
    event: DpEvent, partitions: Iterable[str]
) -> dict[str, DpSgdEvent | GaussianEvent]:
    """The part of ``event`` that enters each of the dataset's partitions.

    A whole-dataset event enters every partition (``"*"`` and every label); a
    :class:`ParallelEvent` enters only the partitions it names (parallel composition over
    disjoint, publicly labelled partitions: McSherry 2009, PINQ).

    Raises:
        DpsynthError: ``invalid_request`` when a parallel event names an undeclared partition.
    """
    names = list(partitions)
    if not isinstance(event, ParallelEvent):
        return {p: event for p in names}
    out: dict[str, DpSgdEvent | GaussianEvent] = {}
    for name, sub in event.partitions.items():
        if name not in names or name == WHOLE_DATASET:
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               f"partition {name!r} is not a declared label of the dataset")
        if isinstance(sub, ParallelEvent):
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               "nested parallel events are not supported")
        out[name] = sub
    return out


def check_neighbouring(event: DpEvent, dataset_relation: Neighbouring) -> None:
    """Refuse an event whose neighbouring relation cannot enter the dataset's.

    A mechanism analysed only under replace-one never enters an add/remove dataset (group
    privacy does not run that way). An add/remove event could enter a replace-one dataset at
    group distance 2 (Mironov 2017, "Rényi Differential Privacy", Prop. 2: (α, ε)-RDP gives
    (α/2, 3ε)-RDP for pairs at distance 2); that bound is not implemented yet, so such events are
    refused too, with a message that says so.

    Raises:
        DpsynthError: ``unsupported_neighbouring``.
    """
    relations = {event.neighbouring}
    if isinstance(event, ParallelEvent):
        relations |= {sub.neighbouring for sub in event.partitions.values()}
    for relation in relations:
        if relation == dataset_relation:
            continue
        if relation == Neighbouring.REPLACE_ONE:
            detail = ("a mechanism analysed under replace-one cannot enter an add/remove dataset "
                      "(group privacy does not run that way)")
        else:
            detail = ("an add/remove mechanism may enter a replace-one dataset only through group "
                      "privacy at distance 2 (Mironov 2017, Prop. 2), which this ledger does not "
                      "implement yet")
        raise DpsynthError(ErrorCode.UNSUPPORTED_NEIGHBOURING, detail,
                           event_neighbouring=str(relation),
                           dataset_neighbouring=str(dataset_relation))
