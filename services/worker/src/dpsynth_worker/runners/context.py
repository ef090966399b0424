"""What one job attempt runs with: the claim, the ports, the ML core and its stop flags."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.worker_contract import Claim

from dpsynth_worker.ml_port import MlPort
from dpsynth_worker.ports import ApiPort, LedgerPort
from dpsynth_worker.runners.heartbeat import Heartbeater


@dataclass
class StopFlags:
    """Reasons to stop at the next step boundary, set from other threads."""

    cancel: threading.Event = field(default_factory=threading.Event)
    stale: threading.Event = field(default_factory=threading.Event)
    shutdown: threading.Event = field(default_factory=threading.Event)

    def any(self) -> bool:
        """True when the attempt must stop (cancel, fenced off, or SIGTERM)."""
        return self.cancel.is_set() or self.stale.is_set() or self.shutdown.is_set()


@dataclass
class JobContext:
    """One claimed attempt of a job and everything its runner may touch."""

    claim: Claim
    api: ApiPort
    ledger: LedgerPort
    store: ObjectStore
    work_dir: Path
    worker_id: str
    ml: MlPort
    flags: StopFlags
    heartbeat: Heartbeater

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def attempt(self) -> int:
        return self.claim.attempt
