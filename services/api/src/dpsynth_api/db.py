"""Engine and session factory. Repositories ``flush()``; a use case commits once."""

from __future__ import annotations

from datetime import UTC, datetime

from dpsynth_shared.settings import DatabaseSettings
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

SCHEMA = "api"


class Base(DeclarativeBase):
    """Declarative base: every api table lives in schema ``api`` (DESIGN §2)."""

    metadata = MetaData(schema=SCHEMA)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the only clock the api uses)."""
    return datetime.now(UTC)


def make_engine(settings: DatabaseSettings) -> Engine:
    """Create the SQLAlchemy engine (psycopg 3) for the api database.

    ``hide_parameters``: a failed statement's error, and so any log record of it, never
    carries the values it was writing (private per-class counts among them).
    """
    return create_engine(settings.url, pool_size=settings.pool_size,
                         max_overflow=settings.max_overflow,
                         pool_timeout=settings.pool_timeout_s, echo=settings.echo,
                         pool_pre_ping=True, hide_parameters=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (responses are built after it)."""
    return sessionmaker(engine, expire_on_commit=False)
