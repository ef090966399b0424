"""Issue 14, item 10: the embedded platform's log files are owner-only (0600, folder 0700)."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpsynth_cli.embedded.processes import spawn, terminate


@pytest.fixture()
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_spawned_process_log_is_owner_only(tmp_path: Path, loose_umask: None) -> None:
    log = tmp_path / "home" / "logs" / "api.log"
    record = spawn("api", [sys.executable, "-c", "print('hello')"], log=log, env=os.environ)
    deadline = time.monotonic() + 10
    while record.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    terminate(record, timeout=1)
    assert "hello" in log.read_text()
    assert _mode(log) == 0o600
    assert _mode(log.parent) == 0o700


def test_existing_world_readable_log_is_tightened(tmp_path: Path, loose_umask: None) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    log = logs / "worker.log"
    log.write_text("old line\n")
    log.chmod(0o644)
    record = spawn("worker", [sys.executable, "-c", "pass"], log=log, env=os.environ)
    terminate(record, timeout=1)
    assert _mode(log) == 0o600 and _mode(logs) == 0o700
    assert log.read_text().startswith("old line")  # appended, not truncated
