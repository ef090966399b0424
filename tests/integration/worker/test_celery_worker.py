"""A real worker process (``python -m dpsynth_worker``) consuming ``dpsynth.run_job`` from the
real Redis broker, against a tiny real HTTP server standing in for the api that refuses
every claim: the worker must claim with the message's attempt and then do nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import celery
import pytest

WORKER_TOKEN = "worker-token-for-tests-0123456789"


class _Recorder(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        type(self).requests.append({"method": "POST", "path": self.path, "body": body,
                                    "auth": self.headers.get("Authorization")})
        if self.path.endswith("/claim"):
            self._answer(409, {"type": "https://dpsynth.dev/problems/claim-refused",
                               "title": "Claim refused", "status": 409, "code": "claim_refused",
                               "detail": "the job is not queued with this attempt"})
        else:
            self._answer(500, {"title": "unexpected", "status": 500, "code": "internal_error",
                               "detail": "the test server expected nothing but claims"})

    do_GET = do_POST

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def fake_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.requests
    server.shutdown()


@pytest.fixture()
def broker_url(redis_url: str) -> str:
    # a database of its own, so no other test's messages reach this worker
    return redis_url.rsplit("/", 1)[0] + "/7"


@pytest.fixture()
def worker(tmp_path: Path, broker_url: str,
           fake_api: tuple[str, list[dict[str, Any]]]) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "XDG_RUNTIME_DIR": "/tmp",
           "DPSYNTH_WORKER_BROKER_URL": broker_url,
           "DPSYNTH_WORKER_API__URL": fake_api[0],
           "DPSYNTH_WORKER_API__TOKEN": WORKER_TOKEN,
           "DPSYNTH_WORKER_LEDGER__URL": "http://127.0.0.1:9",
           "DPSYNTH_WORKER_LEDGER__TOKEN": "ledger-token-for-tests-0123456789",
           "DPSYNTH_WORKER_OBJECT_STORE__KIND": "local",
           "DPSYNTH_WORKER_OBJECT_STORE__ROOT": str(tmp_path / "objects"),
           "DPSYNTH_WORKER_WORK_DIR": str(tmp_path / "work"),
           "DPSYNTH_WORKER_WORKER_ID": "w-int"}
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "dpsynth_worker"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()


def _wait_for(requests: list[dict[str, Any]], count: int, proc: subprocess.Popen[bytes],
              timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(requests) < count:
        assert proc.poll() is None, "the worker process died"
        assert time.monotonic() < deadline, f"only {len(requests)} requests after {timeout}s"
        time.sleep(0.1)


def test_worker_claims_and_drops_refused_messages(
        worker: subprocess.Popen[bytes], broker_url: str,
        fake_api: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, requests = fake_api
    job_id = f"job_{uuid.uuid4().hex}"
    sender = celery.Celery(broker=broker_url)
    sender.send_task("dpsynth.run_job", args=[job_id, 3], queue="dpsynth")
    _wait_for(requests, 1, worker)
    # the same job again (a redelivered or duplicated message): refused just the same
    sender.send_task("dpsynth.run_job", args=[job_id, 3], queue="dpsynth")
    _wait_for(requests, 2, worker)
    time.sleep(1.5)  # anything else the worker would do after a refusal would show by now
    expected = {"method": "POST", "path": f"/internal/v1/jobs/{job_id}/claim",
                "body": {"attempt": 3, "worker_id": "w-int"}, "auth": f"Bearer {WORKER_TOKEN}"}
    assert requests == [expected, expected]
    assert not any((tmp_path / "work").glob("*"))
    # SIGTERM: a warm shutdown with nothing running exits cleanly
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    logs = (tmp_path / "worker.log").read_text()
    assert '"claim refused; dropping the message"' in logs
