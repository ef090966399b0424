"""Running the api's alembic migrations programmatically (prestart and ``migrate``)."""

from __future__ import annotations

import time

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

from dpsynth_api.settings import ApiSettings


def alembic_config(settings: ApiSettings) -> Config:
    """An alembic Config for ``migrations/api`` and the configured database."""
    cfg = Config()
    cfg.set_main_option("script_location", str(settings.migrations_dir))
    cfg.set_main_option("sqlalchemy.url", settings.database.url.replace("%", "%%"))
    return cfg


def upgrade_head(settings: ApiSettings) -> None:
    """``alembic upgrade head`` for the api schema."""
    command.upgrade(alembic_config(settings), "head")


def wait_for_database(settings: ApiSettings, *, timeout_s: float = 60.0) -> None:
    """Block until the database answers ``SELECT 1`` (prestart, like the FastAPI template).

    Raises:
        TimeoutError: the database did not answer in time.
    """
    engine = create_engine(settings.database.url, hide_parameters=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                return
            except Exception:  # noqa: BLE001 - any connection error means "not yet"
                if time.monotonic() > deadline:
                    raise TimeoutError("the api database did not become reachable") from None
                time.sleep(1.0)
    finally:
        engine.dispose()
