"""What the use cases need besides a Session: settings-derived values and metrics."""

from __future__ import annotations

from dataclasses import dataclass

from dpsynth_ledger.anchor import ChainKeeper
from dpsynth_ledger.heavy import HeavyWork
from dpsynth_ledger.metrics import LedgerMetrics


@dataclass(frozen=True)
class LedgerContext:
    """Injected into every use case (built once by ``create_app``)."""

    lease_ttl_s: int
    signing_key: str
    discretization: float
    metrics: LedgerMetrics
    heavy: HeavyWork
    """Plan bounds, the shared calibration cache and the heavy slots (heavy.py)."""
    chain: ChainKeeper | None = None
    """The chain key and anchor (None only in code paths that never write entries)."""
    tight_inline: bool = False
    """Budget views compute missing tight figures themselves (tests only; tight.py)."""
