"""The port through which the platform steers a training run (cosmicpython-style Protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dpsynth_ml.spec import CentralImages


class TrainingHooks(Protocol):
    """Callbacks the worker passes to :func:`dpsynth_ml.train`.

    The privacy budget is charged in :meth:`acquire_steps` *before* steps run (docs/privacy.md,
    "Charging"), so the trainer never runs a step it was not granted.
    """

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        """Ask for logical steps ``[start, start + count)``.

        ``partition`` is None for a whole-dataset job and the class name for a step of a
        per-label job (whose steps are counted per class, each from 0).

        Returns:
            How many are granted (0 = stop now).
        """
        ...

    def charge_release(self, release: CentralImages) -> None:
        """Charge the one-shot DP release ``release`` the run is about to make.

        Called once per release actually drawn, before its noise is drawn (never for a
        release restored from a checkpoint: its images are public and kept). Raise to refuse
        (the budget would be overspent): nothing private has left the run then.
        """
        ...

    def should_stop(self) -> bool:
        """Return True to stop at the next step boundary (cancel, SIGTERM)."""
        ...

    def on_progress(self, step: int, total: int) -> None:
        """Report data-independent progress."""
        ...

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        """A checkpoint for ``step`` is complete on disk at ``checkpoint_dir``."""
        ...

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        """Owner-only, non-DP statistics computed on private data (loss, fraction clipped)."""
        ...


class NullHooks:
    """Grants every step, never stops, ignores reports (pretraining and tests)."""

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        """Grant all ``count`` steps."""
        return count

    def charge_release(self, release: CentralImages) -> None:
        """Nothing to charge: the caller accounted the release (benchmarks, tests)."""

    def should_stop(self) -> bool:
        """Never stop."""
        return False

    def on_progress(self, step: int, total: int) -> None:
        """Ignore progress."""

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        """Ignore checkpoints."""

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        """Drop private statistics."""
