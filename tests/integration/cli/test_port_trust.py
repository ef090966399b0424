"""Issue 14, item 3: ``dpsynth up`` trusts only what proves to be its own process.

With real processes: a foreign HTTP server (a real ``http.server`` answering ``/readyz`` and
``/healthz`` 200) takes the api's port after ``up`` checked it, and ``up`` fails naming the
port, points nothing at that server and sends it no key; the next ``up`` on the same home
starts (its ``/metrics`` need the embedded metrics token, item 11). The readiness watch is
also run on its own against a real process that dies of "address already in use".
"""

from __future__ import annotations

import json
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
from dpsynth_cli.embedded import EmbeddedPlatform, PlatformError, load_or_create_secrets, processes
from dpsynth_cli.embedded.postgres import postgres_running
from dpsynth_cli.embedded.processes import spawn, terminate
from dpsynth_cli.embedded.readiness import Service, wait_ready
from dpsynth_cli.main import app
from typer.testing import CliRunner


class Foreign(ThreadingHTTPServer):
    """Another program's server: says 200 to everything and remembers what it was sent."""

    seen: list[tuple[str, dict[str, str]]]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        assert isinstance(self.server, Foreign)
        self.server.seen.append((self.path, dict(self.headers)))
        body = b'{"status": "ready"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_GET

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture()
def foreign() -> Iterator[Foreign]:
    server = Foreign(("127.0.0.1", 0), _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_up_refuses_a_foreign_server_on_its_port_then_starts_once_it_is_gone(
        tmp_path: Path, foreign: Foreign, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    port = foreign.server_address[1]
    # The race of the issue: the port is free when `up` checks it, taken when the api binds.
    real_check = processes.port_is_free
    monkeypatch.setattr(processes, "port_is_free",
                        lambda p, host="127.0.0.1": p == port or real_check(p, host))

    result = CliRunner().invoke(app, ["up", "--home", str(home), "--api-port", str(port),
                                      "--detach"])

    said = _one_line(result.output)
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{port}" in said and "is not this platform's api" in said, said
    # Nothing points at the foreign server, and it was sent nothing but challenges.
    assert not (home / "credentials.json").exists()
    assert str(port) not in (home / "platform.json").read_text()
    assert not (home / "logs" / "worker-0.log").exists()  # no worker was ever started
    assert foreign.seen and all(path.startswith("/readyz?challenge=") for path, _ in foreign.seen)
    assert not any("authorization" in {k.lower() for k in h} for _, h in foreign.seen)
    platform = EmbeddedPlatform(home)
    assert not platform.is_running() and not postgres_running(home / "pg")

    monkeypatch.undo()
    foreign.shutdown()
    foreign.server_close()
    platform = EmbeddedPlatform(home, api_port=port, workers=0)
    state = platform.start()
    try:
        creds = json.loads((home / "credentials.json").read_text())
        assert creds["api_url"] == state.api_url == f"http://127.0.0.1:{port}"
        assert stat.S_IMODE((home / "credentials.json").stat().st_mode) == 0o600
        assert not (home / "credentials.staged.json").exists()
        status = platform.status()
        assert status["ready"] == {"ledger": True, "api": True}, status
        secrets = load_or_create_secrets(home)
        for url in (state.api_url, state.ledger_url):
            assert httpx.get(f"{url}/metrics", timeout=10).status_code == 401
            scrape = httpx.get(f"{url}/metrics", timeout=10,
                               headers={"Authorization": f"Bearer {secrets.metrics_token}"})
            assert scrape.status_code == 200, scrape.text
        # The instance secrets go through the environment: not on a command line, not logged.
        logs = "".join(p.read_text(errors="replace") for p in (home / "logs").glob("*.log"))
        for record in state.processes:
            cmdline = " ".join(psutil.Process(record.pid).cmdline())
            for secret in state.instance_secrets.values():
                assert secret not in cmdline and secret not in logs
    finally:
        platform.stop()


def _held_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: a probe is refused at once
    return sock


def test_the_watch_names_the_service_its_port_and_why_it_died(tmp_path: Path) -> None:
    """A process of ours that cannot bind (a port held by a program that serves nothing)
    fails the start at once, with the cause from its log."""
    with _held_port() as held:
        port = held.getsockname()[1]
        binder = (f"import socket; s = socket.socket(); "
                  f"s.bind(('127.0.0.1', {port})); s.listen()")
        record = spawn("api", [sys.executable, "-c", binder], log=tmp_path / "api.log",
                       env={"PATH": "/usr/bin:/bin"})
        api = Service(record=record, port=port, secret="s" * 32)
        with pytest.raises(PlatformError) as failed:
            wait_ready(api, watch=[api], timeout=30)
    said = str(failed.value)
    assert said.startswith(f"api (port {port}) exited during start")
    assert f"port {port} is taken by another process (address already in use)" in said


def test_the_watch_fails_when_an_earlier_service_dies(tmp_path: Path, foreign: Foreign) -> None:
    """While the api starts, the ledger started before it is watched too."""
    dead = spawn("ledger", [sys.executable, "-c", "raise SystemExit('ledger: boom')"],
                 log=tmp_path / "ledger.log", env={"PATH": "/usr/bin:/bin"})
    sleeper = spawn("api", [sys.executable, "-c", "import time; time.sleep(60)"],
                    log=tmp_path / "api.log", env={"PATH": "/usr/bin:/bin"})
    try:
        ledger = Service(record=dead, port=1, secret="s" * 32)
        api = Service(record=sleeper, port=foreign.server_address[1], secret="s" * 32)
        psutil.Process(dead.pid).wait(10)
        with pytest.raises(PlatformError, match=r"ledger \(port 1\) exited during start"):
            wait_ready(api, watch=[ledger, api], timeout=30)
    finally:
        terminate(sleeper, timeout=5)
