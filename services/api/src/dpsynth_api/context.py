"""The process-wide objects the app is built from (settings and ports), held on app.state."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_api.metrics import ApiMetrics
from dpsynth_api.ports import LedgerPort, ObjectStore, TaskSender
from dpsynth_api.settings import ApiSettings


@dataclass
class AppContext:
    """Settings, database and ports of one app instance (injected via :mod:`dpsynth_api.deps`)."""

    settings: ApiSettings
    engine: Engine
    sessions: sessionmaker[Session]
    store: ObjectStore
    ledger: LedgerPort
    sender: TaskSender
    metrics: ApiMetrics
