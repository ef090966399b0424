"""The adapters a worker process builds once at start and every task reuses."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.stores import from_settings

from dpsynth_worker.clients import ApiClient, LedgerClient
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.ml_port import MlPort
from dpsynth_worker.ports import ApiPort, LedgerPort
from dpsynth_worker.settings import WorkerSettings


@dataclass
class WorkerRuntime:
    """Ports and process-wide state of one worker process."""

    api: ApiPort
    ledger: LedgerPort
    store: ObjectStore
    work_dir: Path
    worker_id: str
    shutdown: threading.Event = field(default_factory=threading.Event)
    ml: MlPort = field(default_factory=MlAdapter)


def build_runtime(settings: WorkerSettings) -> WorkerRuntime:
    """Build the HTTP clients and the object store from the settings (a claim waiting for
    the api gives up when the worker shuts down, so its message is requeued at once)."""
    shutdown = threading.Event()
    api = ApiClient(settings.api.url, settings.api.token.get_secret_value(),
                    claim_patience_s=settings.claim_patience_s, stop=shutdown)
    ledger = LedgerClient(settings.ledger.url, settings.ledger.token.get_secret_value())
    store = from_settings(settings.object_store,
                          grant_public_key=settings.grant_public_keys or None)
    work_dir = Path(settings.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    return WorkerRuntime(api=api, ledger=ledger, store=store, work_dir=work_dir,
                         worker_id=settings.worker_id, shutdown=shutdown,
                         ml=MlAdapter(inception_weights=settings.inception_weights,
                                      devices=settings.devices))


_current: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime) -> None:
    """Make ``runtime`` the one the task uses in this process."""
    global _current
    _current = runtime


def current_runtime() -> WorkerRuntime:
    """The installed runtime (raises if the process was not started by ``__main__``)."""
    if _current is None:
        raise RuntimeError("no worker runtime installed; start with `python -m dpsynth_worker`")
    return _current
