"""What one job attempt runs with: the claim, the ports, the ML core and its stop flags."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.worker_contract import Claim

from dpsynth_worker.ports import ApiPort, LedgerPort
from dpsynth_worker.runners.heartbeat import Heartbeater


def _real(name: str) -> Callable[..., Any]:
    """A late-bound function of :mod:`dpsynth_ml` (imports torch on first call only)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import dpsynth_ml

        return getattr(dpsynth_ml, name)(*args, **kwargs)

    call.__name__ = name
    return call


def _real_placed() -> Callable[..., Any]:
    """:func:`dpsynth_ml.placement.train_placed`, late-bound like the others."""

    def call(*args: Any, **kwargs: Any) -> Any:
        from dpsynth_ml.placement import train_placed

        return train_placed(*args, **kwargs)

    call.__name__ = "train_placed"
    return call


def _real_evaluation(name: str) -> Callable[..., Any]:
    """A late-bound function of :mod:`dpsynth_ml.evaluation` (evaluate and feature_net jobs)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        from dpsynth_ml import evaluation

        return getattr(evaluation, name)(*args, **kwargs)

    call.__name__ = name
    return call


@dataclass(frozen=True)
class MlCore:
    """The ML core's functions, injectable so runners can be tested with a fake core."""

    train: Callable[..., Any] = field(default_factory=lambda: _real("train"))
    #: train on the devices of the worker's DEVICES setting (``devices``, below)
    train_placed: Callable[..., Any] = field(default_factory=_real_placed)
    sample: Callable[..., Any] = field(default_factory=lambda: _real("sample"))
    model_hash: Callable[[Path], str] = field(default_factory=lambda: _real("model_hash"))
    read_model_info: Callable[[Path], Any] = field(
        default_factory=lambda: _real("read_model_info"))
    check_training: Callable[[Any, Path], None] = field(
        default_factory=lambda: _real("check_training"))
    train_feature_net: Callable[..., Any] = field(
        default_factory=lambda: _real_evaluation("train_feature_net"))
    evaluate_corpus: Callable[..., Any] = field(
        default_factory=lambda: _real_evaluation("evaluate_corpus"))
    #: pytorch-fid's InceptionV3 weights on this worker (DPSYNTH_WORKER_INCEPTION_WEIGHTS);
    #: None: evaluate jobs asking for Inception FID fail with inception_weights_unavailable
    inception_weights: Path | None = None
    #: DPSYNTH_WORKER_DEVICES; "cpu" trains in this process on the CPU through ``train``
    devices: str = "cpu"


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
    ml: MlCore
    flags: StopFlags
    heartbeat: Heartbeater

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def attempt(self) -> int:
        return self.claim.attempt
