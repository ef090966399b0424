"""Bounds on the work one plan may cause (issue 14, item 1).

A plan's accounting grows with its runs' steps (PLD calibration) and, per label, with its
classes. The ledger checks every plan, dry run, reservation and extension against
:class:`PlanLimits` before any accounting (``DPSYNTH_LEDGER_PLAN_LIMITS__*``) and the api
checks the same bounds at submission (``DPSYNTH_API_PLAN_LIMITS__*``), refusing with 422
``plan_too_large``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel, Field

from dpsynth_shared.errors import DpsynthError, ErrorCode


class _Run(Protocol):
    @property
    def steps(self) -> int: ...


class PlannedShape(Protocol):
    """What a plan asks for: one run of ``steps``, or one run per label."""

    @property
    def steps(self) -> int | None: ...

    @property
    def per_label(self) -> Mapping[str, _Run] | None: ...


class PlanLimits(BaseModel):
    """Bounds on the work one plan may cause, checked before any accounting (issue 14,
    item 1). PLD calibration costs grow with a run's steps (0.1 s at 5,000 steps, ~1-4 s at
    100,000, ~10 s at 1,000,000 on one core), and a per-label job calibrates one run per
    class; the defaults keep 15x headroom over the largest paper-sized job (DP-LDM: 200 epochs
    of MNIST at batch 2,000, 6,000 steps; DPDM: 300 epochs at batch 4,096, 4,395 steps;
    DP-DocLDM per label: 16 classes of ~5,000 steps)."""

    max_steps: int = Field(100_000, ge=1, description="steps of one run (epochs x N / batch)")
    max_total_steps: int = Field(1_000_000, ge=1, description="steps of all a plan's runs "
                                 "together (per label: summed over the classes)")
    max_runs: int = Field(1_000, ge=1, description="runs of one plan (per-label classes)")


def check_plan_size(shape: PlannedShape, limits: PlanLimits) -> None:
    """Refuse a plan whose accounting would exceed ``limits``, before doing any of it.

    Raises:
        DpsynthError: 422 ``plan_too_large`` naming the bound, its value and the plan's.
    """
    runs = ([shape.steps or 0] if shape.per_label is None
            else [s.steps for s in shape.per_label.values()])
    for bound, value, limit in (("max_runs", len(runs), limits.max_runs),
                                ("max_steps", max(runs, default=0), limits.max_steps),
                                ("max_total_steps", sum(runs), limits.max_total_steps)):
        if value > limit:
            raise DpsynthError(ErrorCode.PLAN_TOO_LARGE,
                               f"the plan needs {value} {bound.removeprefix('max_')}; the "
                               f"ledger accounts at most {limit} ({bound}): fewer epochs or a "
                               "larger batch", bound=bound, limit=limit, value=value)
