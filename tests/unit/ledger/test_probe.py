"""The ledger's readiness probe (compose healthcheck, Kubernetes readinessProbe)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from dpsynth_ledger.probe import ready

ANSWERS = {
    "/ready": (200, {"status": "ready"}),
    "/behind": (503, {"code": "ledger_behind_anchor", "status": 503}),
    "/db-down": (503, {"code": "service_unavailable", "status": 503}),
    "/diverged": (503, {"code": "ledger_anchor_diverged", "status": 503}),
    "/broken": (500, {"code": "internal", "status": 500}),
    "/garbage": (503, None),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ANSWERS[self.path]
        raw = b"not json" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(("path", "expected"), [
    ("/ready", True), ("/behind", True), ("/db-down", False), ("/diverged", False),
    ("/broken", False), ("/garbage", False)])
def test_ready_or_behind_its_anchor_counts_as_ready(base: str, path: str,
                                                    expected: bool) -> None:
    assert ready(base + path) is expected


def test_no_answer_is_not_ready_and_the_module_exits_by_it(base: str) -> None:
    assert ready("http://127.0.0.1:9/readyz", timeout_s=1) is False
    run = [sys.executable, "-m", "dpsynth_ledger.probe"]
    assert subprocess.run([*run, base + "/behind"], timeout=30).returncode == 0
    assert subprocess.run([*run, base + "/db-down"], timeout=30).returncode == 1
