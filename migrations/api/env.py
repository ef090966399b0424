"""Alembic environment of the api: tables in schema ``api``, version table ``api.alembic_version``.

The database URL comes from the config attribute ``sqlalchemy.url`` set by
:func:`dpsynth_api.migrate.alembic_config` (never from an ini file with secrets).
"""

from __future__ import annotations

from alembic import context
from dpsynth_api import tables  # noqa: F401  (registers the tables on the metadata)
from dpsynth_api.db import SCHEMA, Base
from sqlalchemy import create_engine, text

config = context.config
target_metadata = Base.metadata


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    # Only the api's own schema: the ledger's schema may share the database.
    if type_ == "schema":
        return name == SCHEMA
    return True


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"'))
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
    engine.dispose()


run_migrations_online()
