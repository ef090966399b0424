"""Start and stop the embedded platform's local processes, and find them again later.

Every process runs in its own session (process group) so that it outlives a detached
``dpsynth up`` and so that stopping it also stops its children (Celery's pool). A record
(pid + start time) lets ``dpsynth down``, run from another shell, stop exactly the
processes it started and never an unrelated process that reused a pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import psutil


class PlatformError(RuntimeError):
    """The embedded platform could not start (the message carries the log tail)."""


@dataclass(frozen=True)
class ProcessRecord:
    """What ``platform.json`` remembers of one process."""

    name: str
    pid: int
    create_time: float
    log: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def process(self) -> psutil.Process | None:
        """The live process, or ``None`` when it exited or the pid now names another one."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 1.0:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None

    def is_running(self) -> bool:
        return self.process() is not None


def open_log(log: Path) -> BinaryIO:
    """Open ``log`` for appending, owner-only: the file 0600 and its folder 0700, whatever
    the umask and whatever modes an older platform left (logs may name tenants and ids)."""
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(log.parent, 0o700)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def spawn(name: str, argv: Sequence[str], *, log: Path, env: Mapping[str, str],
          cwd: Path | None = None) -> ProcessRecord:
    """Start ``argv`` in a new session with stdout/stderr appended to ``log`` (0600, in a
    0700 folder: see :func:`open_log`)."""
    with open_log(log) as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env), cwd=cwd, start_new_session=True,
        )
    create_time = psutil.Process(proc.pid).create_time()
    return ProcessRecord(name=name, pid=proc.pid, create_time=create_time, log=str(log))


def terminate(record: ProcessRecord, *, timeout: float = 15.0) -> bool:
    """SIGTERM the record's process group, then SIGKILL after ``timeout`` seconds.

    Returns:
        True when a live process was stopped, False when it was already gone.
    """
    proc = record.process()
    if proc is None:
        return False
    _signal_group(record.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        _signal_group(record.pid, signal.SIGKILL)
        try:
            proc.wait(5)
        except psutil.TimeoutExpired:
            pass
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the process leads its own session: pgid == pid
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now by a server (which sets SO_REUSEADDR, so a
    port whose last connections linger in TIME_WAIT after a restart counts as free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def choose_port(preferred: int | None, default: int, *, avoid: set[int] | None = None) -> int:
    """``preferred`` if given (must be free), else ``default`` if free, else any free port.

    Only a hint: another program can take the port before the service binds it, which is
    why ``up`` trusts no answer on it without the instance proof (readiness.py).

    Raises:
        PlatformError: ``preferred`` is taken.
    """
    avoid = avoid or set()
    if preferred is not None:
        if not port_is_free(preferred):
            raise PlatformError(f"port {preferred} is already in use: stop the program "
                                "holding it or choose another port")
        return preferred
    if default not in avoid and port_is_free(default):
        return default
    while (port := free_port()) in avoid:
        pass
    return port


def wait_for_port(port: int, *, timeout: float, host: str = "127.0.0.1") -> None:
    """Wait until something accepts connections on ``host:port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def log_tail(path: Path | str, lines: int = 30) -> str:
    """The last lines of a log file (for error messages)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
