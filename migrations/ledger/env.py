"""Alembic environment of the ledger: schema ``ledger``, version table ``ledger.alembic_version``.

Run through ``python -m dpsynth_ledger migrate`` (programmatic config, see
``dpsynth_ledger.migrate``); the URL comes from the ledger's settings via the config.
"""

from __future__ import annotations

from alembic import context
from dpsynth_ledger.models import SCHEMA, Base
from sqlalchemy import create_engine, text

config = context.config
target_metadata = Base.metadata


def _include_name(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
    if type_ == "schema":
        return name == SCHEMA
    return True


def run_migrations_online() -> None:
    """Migrate the database named by the config's ``sqlalchemy.url``."""
    connectable = config.attributes.get("connection")
    if connectable is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    connection.commit()
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=_include_name,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
