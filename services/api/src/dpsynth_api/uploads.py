"""Staging an upload under the spool folder while it is checked and stored.

Each upload gets its own folder ``<spool_dir>/<kind>-<random>/`` (never the system temp
folder: a crash would leave private data there for good, issue 14, item 9). While the
upload is in flight the folder's ``.lock`` is held with ``flock`` (released by the kernel
when the process dies, however it dies), and before any object is written to the store its
key is appended, fsynced, to the folder's ``objects.intent``. So whatever a crash leaves
behind is findable: a staging folder nobody holds, and the keys of the objects it may have
written. :mod:`dpsynth_api.sweeper` removes both (keeping any object a committed row names).

The folder is removed when the upload's ``with`` block ends: on success after the row is
committed; on failure the data files go at once and only the intent stays, for the sweeper
to check against the database after the grace period (the upload path deletes the objects
it wrote itself; a crash in between is what the intent covers).

The body is copied in fixed chunks by :func:`spool` (the one place every upload byte passes:
a streaming hash of the body would hook in there).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.object_store import ObjectInfo

from dpsynth_api.ports import ObjectStore

_CHUNK = 1 << 20
LOCK_FILE = ".lock"
INTENT_FILE = "objects.intent"
"""The keys of the objects an upload writes, one per line, each fsynced before its write."""
_BINARY = "application/octet-stream"
STAGE_KINDS = ("dataset", "model")
"""What is staged; a staging folder is named ``<kind>-<random>``."""


def too_large(max_bytes: int) -> DpsynthError:
    """The 413 problem of an upload over ``max_bytes``."""
    return DpsynthError(ErrorCode.PAYLOAD_TOO_LARGE,
                        f"the upload is larger than the limit of {max_bytes} bytes",
                        limit=max_bytes)


def spool(source: BinaryIO, dest: Path, *, max_bytes: int) -> int:
    """Copy ``source`` to ``dest`` chunk by chunk; 413 as soon as it passes ``max_bytes``.

    Returns:
        The number of bytes written.
    """
    written = 0
    with dest.open("wb") as out:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > max_bytes:
                raise too_large(max_bytes)
            out.write(chunk)
    return written


def safe_filename(name: str | None, default: str) -> str:
    """A client's file name reduced to its last path component (for format detection)."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    return base or default


class Stage(os.PathLike[str]):
    """One upload's staging folder (a path-like: ``Path(stage) / "upload"``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)

    def will_write(self, key: str) -> None:
        """Record, durably, that the object ``key`` is about to be written."""
        fd = os.open(self.path / INTENT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, key.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def journal(self, store: ObjectStore) -> ObjectStore:
        """``store`` with every write recorded first (:meth:`will_write`)."""
        return _JournaledStore(store, self)


def read_intent(folder: Path) -> list[str]:
    """The object keys a staging folder recorded (none if it wrote nothing)."""
    try:
        text = (folder / INTENT_FILE).read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line]


def is_stage_name(name: str) -> bool:
    """Whether ``name`` is a staging folder's (the sweeper touches nothing else, so a
    spool dir set to a shared folder by mistake loses nothing of others)."""
    return name.startswith(tuple(f"{kind}-" for kind in STAGE_KINDS))


@contextmanager
def staging(spool_dir: Path, kind: str) -> Iterator[Stage]:
    """A locked staging folder for one upload of ``kind`` (``dataset``, ``model``).

    Cover the whole upload with it, the commit included: see the module docstring.
    """
    if kind not in STAGE_KINDS:
        raise ValueError(f"unknown upload kind {kind!r}")
    spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # staged data is private
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=spool_dir))
    lock = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = False
    try:
        yield Stage(path)
        done = True
    finally:
        try:
            if done or not read_intent(path):
                shutil.rmtree(path, ignore_errors=True)
            else:  # the intent stays for the sweeper; the data goes now
                for child in path.iterdir():
                    if child.name not in (INTENT_FILE, LOCK_FILE):
                        _remove(child)
        finally:
            os.close(lock)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class _JournaledStore:
    """An :class:`ObjectStore` that records each key in the stage before writing it."""

    def __init__(self, store: ObjectStore, stage: Stage) -> None:
        self._store, self._stage = store, stage

    def put_file(self, key: str, path: Path, *, content_type: str = _BINARY) -> ObjectInfo:
        self._stage.will_write(key)
        return self._store.put_file(key, path, content_type=content_type)

    def put_bytes(self, key: str, data: bytes, *, content_type: str = _BINARY) -> ObjectInfo:
        self._stage.will_write(key)
        return self._store.put_bytes(key, data, content_type=content_type)

    def get_file(self, key: str, dest: Path, *, grant: str | None = None) -> ObjectInfo:
        return self._store.get_file(key, dest, grant=grant)

    def iter_chunks(self, key: str, *, grant: str | None = None,
                    chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self._store.iter_chunks(key, grant=grant, chunk_size=chunk_size)

    def stat(self, key: str) -> ObjectInfo | None:
        return self._store.stat(key)

    def delete(self, key: str) -> None:
        self._store.delete(key)

    def presign_get(self, key: str, *, ttl: timedelta) -> str:
        return self._store.presign_get(key, ttl=ttl)


__all__ = ["INTENT_FILE", "LOCK_FILE", "STAGE_KINDS", "Stage", "is_stage_name", "read_intent",
           "safe_filename", "spool", "staging", "too_large"]
