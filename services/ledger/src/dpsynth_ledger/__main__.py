"""``python -m dpsynth_ledger [serve|migrate]``: wait for the DB, migrate, serve."""

from __future__ import annotations

import sys

from dpsynth_shared.logging import configure_logging


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``migrate`` runs ``alembic upgrade head``; ``serve`` (default) also serves."""
    import uvicorn

    from dpsynth_ledger.app import create_app
    from dpsynth_ledger.migrate import upgrade, wait_for_database
    from dpsynth_ledger.settings import LedgerSettings

    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "serve"
    if command not in ("serve", "migrate"):
        print(f"usage: python -m dpsynth_ledger [serve|migrate] (got {command!r})",
              file=sys.stderr)
        return 2
    settings = LedgerSettings()  # read once, from the environment
    configure_logging("ledger", settings.log_level)
    wait_for_database(settings.database.url, settings.db_wait_s)
    upgrade(settings)
    if command == "migrate":
        return 0
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_config=None, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
