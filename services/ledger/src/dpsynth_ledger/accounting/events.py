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

HOLDOUT = "*holdout"
"""Name of the partition of the dataset's HELD-OUT part (docs/privacy.md, "DP evaluations").

Only mechanisms that read the held-out records alone (DP evaluations) enter it; training
events (``"*"`` and the labels) never do. The 1-stable keyed-hash split makes the held-out and
the training part disjoint under add/remove, so the two sides compose in PARALLEL: the
dataset's filter figure is the max over ``"*"``, every label and this partition. It is created
at the first DP evaluation (a budget without one has no such row), and no label may take its
name."""


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

    A whole-dataset (training) event enters every training partition (``"*"`` and every
    label, never :data:`HOLDOUT`); a
    :class:`ParallelEvent` enters only the partitions it names (parallel composition over
    disjoint, publicly labelled partitions: McSherry 2009, PINQ).

    Raises:
        DpsynthError: ``invalid_request`` when a parallel event names an undeclared partition.
    """
    names = [p for p in partitions if p != HOLDOUT]  # training events never enter it
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


REPLACE_INTO_ADD_REMOVE = (
    "a mechanism analysed only under replace-one cannot enter an add/remove dataset: group "
    "privacy runs from add/remove to replace-one (a replaced record is one removal plus one "
    "addition), never back; a mechanism that releases the dataset's size, for instance, is "
    "replace-one private and not add/remove private at all")


def check_neighbouring(event: DpEvent, dataset_relation: Neighbouring | str) -> None:
    """Refuse an event whose neighbouring relation cannot enter the dataset's.

    * same relation: admitted as analysed;
    * an add/remove event into a replace-one dataset: admitted through group privacy at
      distance 2 (Mironov 2017, "Rényi Differential Privacy", Prop. 2; the charge is
      :func:`dpsynth_ledger.accounting.rdp.group_rdp` of the RDP at twice the order);
    * a replace-one event into an add/remove dataset: refused. Group privacy does not run
      that way: an add/remove neighbour is not a bounded number of replacements away (the
      dataset's size differs), so a replace-one analysis says nothing about it.

    Raises:
        DpsynthError: ``unsupported_neighbouring``.
    """
    relations = {event.neighbouring}
    if isinstance(event, ParallelEvent):
        relations |= {sub.neighbouring for sub in event.partitions.values()}
    dataset = Neighbouring(dataset_relation)
    if dataset == Neighbouring.ADD_REMOVE and Neighbouring.REPLACE_ONE in relations:
        raise DpsynthError(ErrorCode.UNSUPPORTED_NEIGHBOURING, REPLACE_INTO_ADD_REMOVE,
                           event_neighbouring=str(Neighbouring.REPLACE_ONE),
                           dataset_neighbouring=str(dataset))
