"""Programmatic Alembic for the ledger: find ``migrations/ledger`` and run ``upgrade head``."""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from dpsynth_ledger.settings import LedgerSettings


def find_migrations_dir(override: Path | None = None) -> Path:
    """``migrations/ledger`` of the repository: walk up from this file (or use the override).

    Raises:
        FileNotFoundError: when no ancestor holds ``migrations/ledger/env.py``.
    """
    if override is not None:
        return override
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "migrations" / "ledger"
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("migrations/ledger not found; set DPSYNTH_LEDGER_MIGRATIONS_DIR")


def alembic_config(database_url: str, migrations_dir: Path | None = None) -> Config:
    """An Alembic config for the ledger's migrations against ``database_url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(find_migrations_dir(migrations_dir)))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(settings: LedgerSettings, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` on the ledger's database."""
    command.upgrade(alembic_config(settings.database.url, settings.migrations_dir), revision)


def downgrade(settings: LedgerSettings, revision: str = "base") -> None:
    """``alembic downgrade <revision>`` on the ledger's database."""
    command.downgrade(alembic_config(settings.database.url, settings.migrations_dir), revision)


def wait_for_database(url: str, timeout_s: float) -> None:
    """Block until ``SELECT 1`` succeeds (prestart), or raise after ``timeout_s``."""
    engine = create_engine(url, hide_parameters=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                return
            except OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
    finally:
        engine.dispose()
