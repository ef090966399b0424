"""The unit layout of a micro-batch: which privacy unit each (draw, example) row belongs to.

A row r = (draw k, example i) of the K forward passes belongs to one unit u: the example
itself (records; K rows per unit) or its subject (user-level DP; all draws of all the
subject's images in the micro-batch). The layer rules (:mod:`.layers`) read the layout to
fold rows into units; the engine (:mod:`.engine`) builds it and clips per unit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Rows:
    """The rows of one micro-batch: unit[k, i] is the unit of example i's k-th draw,
    scale[i] its weight in the unit (the subject weight; 1/K is already in the gradient)."""

    unit: torch.Tensor  # [K, b] int64
    scale: torch.Tensor  # [b]
    num_units: int

    @functools.cached_property
    def unit_weights(self) -> bool:
        """Whether every row weighs 1 in its unit (records; subjects of equal weight)."""
        return bool((self.scale == 1).all())

    @property
    def example_units(self) -> bool:
        """Whether unit i is exactly example i's K rows (records with K draws)."""
        arange = torch.arange(self.unit.shape[1])
        return bool((self.unit == arange).all())

    @property
    def one_row_each(self) -> bool:
        """Whether row i of the single pass is unit i (K = 1, one example per unit)."""
        return self.unit.shape[0] == 1 and bool(
            torch.equal(self.unit[0], torch.arange(self.unit.shape[1])))

    def slots(self, per_unit: torch.Tensor) -> torch.Tensor:
        """The slot of each flat row (passes in order) within its unit: its rank among the
        unit's rows, given ``per_unit`` (the rows of each unit, from ``bincount``)."""
        flat_unit = self.unit.reshape(-1)
        order = torch.argsort(flat_unit, stable=True)
        starts = torch.cumsum(per_unit, 0) - per_unit
        slot = torch.empty_like(flat_unit)
        slot[order] = torch.arange(len(flat_unit)) - starts[flat_unit[order]]
        return slot


def group_rows(groups: torch.Tensor, weights: torch.Tensor, draws: int) -> _Rows:
    """The layout where every (draw, example) row's unit is the example's group, for all
    K = ``draws`` passes, with the example's weight (``groups`` numbered 0, 1, ...)."""
    groups = groups.to(torch.long)
    return _Rows(unit=groups.unsqueeze(0).expand(draws, -1).contiguous(),
                 scale=weights.to(torch.float64),
                 num_units=int(groups.max()) + 1 if groups.numel() else 0)
