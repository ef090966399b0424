"""What an upload interrupted by a crash leaves behind is swept (issue 14, item 9).

Killing the api mid-upload used to leave its spool files in the system temp folder and the
object it had just stored, for good. Now uploads are staged under ``spool_dir``, each
object's key is recorded before it is written, and the api sweeps at start and every
``sweep_interval_s``. The crashes here are real: a child process stages an upload with the
api's own code, writes its object to the store and is killed with SIGKILL. The database is
the real PostgreSQL; committed rows come from real uploads through the api.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from dpsynth_shared.stores.local import LocalDirStore

from tests.integration.api.conftest import Api

HOUR = 3600.0

_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dpsynth_api.uploads import staging
    from dpsynth_shared.stores.local import LocalDirStore

    spool, objects, key, write = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    with staging(spool, "dataset") as stage:
        data = Path(stage) / "upload"
        data.write_bytes(b"private bytes " * 4096)
        if write == "write":
            stage.journal(LocalDirStore(objects)).put_file(key, data)
        else:  # killed between recording the key and writing the object
            stage.will_write(key)
        print(Path(stage).name, flush=True)
        time.sleep(120)  # killed here: after the object, before any row is committed
""")


@contextmanager
def _uploading(spool: Path, objects: Path, key: str, *, write: bool = True,
               ) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A child process in the middle of an upload (its object written, no row yet)."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(spool), str(objects), key,
                              "write" if write else "record"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        folder = child.stdout.readline().strip()
        assert folder, "the child did not stage its upload"
        yield folder, child
    finally:
        child.kill()
        child.wait(timeout=10)


def _crash(spool: Path, objects: Path, key: str, *, write: bool = True) -> str:
    """An upload killed with SIGKILL after writing its object; its staging folder's name."""
    with _uploading(spool, objects, key, write=write) as (folder, child):
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    return folder


def _age(path: Path, seconds: float) -> None:
    """Make ``path`` (and what it holds) look ``seconds`` old."""
    when = time.time() - seconds
    for child in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(child, (when, when))


def _key(n: int) -> str:
    return f"public/datasets/ds_{n:032x}/data.npz"


def _swept(api: Api, kind: str) -> float:
    text = api.client.app.state.ctx.metrics.render().decode()  # type: ignore[attr-defined]
    line = next((ln for ln in text.splitlines()
                 if ln.startswith(f'dpsynth_api_swept_total{{kind="{kind}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


@pytest.fixture()
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "spool", tmp_path / "objects"


def test_uploads_are_staged_under_the_spool_dir_and_leave_nothing(
        make_api: Callable[..., Api], paths: tuple[Path, Path]) -> None:
    spool, _ = paths
    api = make_api(spool_dir=str(spool))
    _, token = api.tenant()
    api.public_dataset(token)
    api.model(token)
    refused = api.upload(token, b"not an archive", {"name": "x", "visibility": "public"})
    assert refused.status_code == 422
    assert spool.is_dir() and not any(spool.iterdir())
    assert spool.stat().st_mode & 0o077 == 0  # staged uploads are private data


def test_the_sweep_at_start_removes_what_a_crash_left_and_keeps_the_rest(
        make_api: Callable[..., Api], paths: tuple[Path, Path]) -> None:
    spool, objects = paths
    first = make_api(spool_dir=str(spool), sweep_enabled=False)
    _, token = first.tenant()
    committed = first.public_dataset(token)
    committed_key = next(k for k in _keys(objects) if committed in k)
    store = LocalDirStore(objects)
    # a crash mid-upload, an hour and more ago: its staging folder and its object
    orphan = _crash(spool, objects, _key(1))
    # a crash after the commit of its row, before its folder was removed
    after_commit = _crash(spool, objects, committed_key, write=False)
    stray = spool / "dataset-killed-while-spooling"  # no object recorded yet
    stray.mkdir()
    (stray / "upload").write_bytes(b"x" * 1000)
    foreign = spool / "not-ours.txt"  # the sweeper only touches staging folders
    foreign.write_bytes(b"y")
    for entry in spool.iterdir():
        _age(entry, 2 * HOUR)
    # a crash a moment ago: within the grace period (another host may still own it)
    recent = _crash(spool, objects, _key(2))
    with _uploading(spool, objects, _key(3)) as (live, _):
        _age(spool / live, 2 * HOUR)  # old, but a live process holds its lock
        api = make_api(spool_dir=str(spool), sweep_grace_s=HOUR, sweep_interval_s=HOUR)
        assert store.stat(_key(1)) is None and not (spool / orphan).exists()
        assert not stray.exists() and not (spool / after_commit).exists()
        assert foreign.exists()
        assert store.stat(committed_key) is not None  # its row is committed: kept
        assert (spool / recent).exists() and store.stat(_key(2)) is not None
        assert (spool / live).exists() and store.stat(_key(3)) is not None
        assert _swept(api, "object") == 1 and _swept(api, "spool") == 3
    assert first.client.get(f"/v1/datasets/{committed}",
                            headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_the_periodic_sweep_removes_an_orphan_once_its_grace_is_over(
        make_api: Callable[..., Api], paths: tuple[Path, Path]) -> None:
    spool, objects = paths
    api = make_api(spool_dir=str(spool), sweep_grace_s=1.0, sweep_interval_s=0.2)
    folder = _crash(spool, objects, _key(4))
    store = LocalDirStore(objects)
    deadline = time.monotonic() + 15
    while (spool / folder).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (spool / folder).exists()
    assert store.stat(_key(4)) is None
    assert _swept(api, "object") == 1


def _keys(objects: Path) -> list[str]:
    return [str(p.relative_to(objects)) for p in objects.rglob("*.npz")
            if ".meta" not in p.parts]
