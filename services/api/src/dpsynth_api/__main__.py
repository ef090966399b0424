"""``python -m dpsynth_api``: wait for the DB → ``alembic upgrade head`` → bootstrap the admin
tenant when asked → serve uvicorn (the reaper starts with the app).
``python -m dpsynth_api migrate``: migrations only (Kubernetes Job / compose one-shot)."""

from __future__ import annotations

import sys

from dpsynth_shared.logging import configure_logging

from dpsynth_api.db import make_engine, make_session_factory
from dpsynth_api.migrate import upgrade_head, wait_for_database
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tenants.service import bootstrap_admin


def _bootstrap(settings: ApiSettings) -> None:
    if settings.bootstrap_credentials_file is None:
        return
    engine = make_engine(settings.database)
    try:
        with make_session_factory(engine)() as session:
            bootstrap_admin(session, credentials_file=settings.bootstrap_credentials_file,
                            api_url=settings.api_url)
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = sys.argv[1:] if argv is None else argv
    settings = ApiSettings()  # values come from the environment
    configure_logging("api", settings.log_level)
    wait_for_database(settings)
    upgrade_head(settings)
    if args[:1] == ["migrate"]:
        return 0
    if args:
        print(f"unknown command {args[0]!r}; use 'migrate' or nothing", file=sys.stderr)
        return 2
    _bootstrap(settings)

    import uvicorn

    from dpsynth_api.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_config=None, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
