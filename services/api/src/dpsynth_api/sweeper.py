"""Sweeping what crashed uploads left behind (issue 14, item 9): at start and periodically.

An upload stages its bytes under ``spool_dir`` and records the key of every object it
writes before writing it (:mod:`dpsynth_api.uploads`). A crash (SIGKILL, OOM, power) leaves
its staging folder, possibly with an ``objects.intent``. A folder is an orphan when

* no live process holds its ``flock`` (the kernel drops the lock of a dead process), and
* nothing in it changed for ``sweep_grace_s`` (a second guard for spool folders on a
  shared volume, where another host's lock may not be visible).

For an orphan, each recorded object that no committed dataset or model row names is
deleted from the store (a row committed just before the crash keeps its object: the row is
checked, not assumed), then the folder goes. An upload in flight is never touched: its lock
is held, and its object is only written after its key is recorded. Only entries named like
staging folders (``dataset-*``, ``model-*``) are looked at, so a spool dir set to a shared
folder by mistake loses nothing else; the ``dpsynth-upload-*``/``dpsynth-model-*`` folders
older versions left in the system temp folder are removed after the same grace period.

What is swept is logged by staging folder name, object key and byte count only (no file
contents, no names from the upload) and counted in ``dpsynth_api_swept_total`` and
``dpsynth_api_swept_bytes_total``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_api.metrics import ApiMetrics
from dpsynth_api.ports import ObjectStore
from dpsynth_api.tables import Dataset, Model
from dpsynth_api.uploads import LOCK_FILE, is_stage_name, read_intent

log = logging.getLogger(__name__)

LEGACY_PREFIXES = ("dpsynth-upload-", "dpsynth-model-")
"""Staging folders of versions that staged uploads in the system temp folder."""


@dataclass
class SweepReport:
    """What one sweep removed."""

    spool_entries: int = 0
    spool_bytes: int = 0
    objects: int = 0
    object_bytes: int = 0


def _newest_mtime(path: Path) -> float:
    """The latest modification time of ``path`` and, for a folder, of what it holds."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except FileNotFoundError:
                    continue
    return newest


def _size(path: Path) -> int:
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    return sum(os.lstat(os.path.join(root, name)).st_size
               for root, _, files in os.walk(path) for name in files)


def _try_lock(folder: Path) -> int | None:
    """The folder's lock, taken (an fd to close), or None while a live upload holds it."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _committed(session: Session, key: str) -> bool:
    """Whether a committed dataset or model row names the object ``key``."""
    dataset = session.scalar(select(Dataset.id).where(
        or_(Dataset.object_key == key, Dataset.holdout_object_key == key)).limit(1))
    return dataset is not None or session.scalar(
        select(Model.id).where(Model.object_key == key).limit(1)) is not None


@dataclass
class Sweeper:
    """Removes orphaned staging folders and the objects they wrote (see the module doc).

    Call :meth:`sweep` at start; :meth:`start` runs it every ``interval_s`` in a daemon
    thread until :meth:`stop`.
    """

    spool_dir: Path
    sessions: sessionmaker[Session]
    store: ObjectStore
    grace_s: float
    interval_s: float
    metrics: ApiMetrics | None = None
    legacy_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sweep(self) -> SweepReport:
        """One pass over the spool folder (and the legacy temp folders)."""
        report = SweepReport()
        cutoff = time.time() - self.grace_s
        if self.spool_dir.is_dir():
            for entry in sorted(self.spool_dir.iterdir()):
                if is_stage_name(entry.name):
                    self._sweep_entry(entry, cutoff, report)
        if self.legacy_dir.is_dir() and self.legacy_dir.resolve() != self.spool_dir.resolve():
            for entry in sorted(self.legacy_dir.iterdir()):
                if entry.name.startswith(LEGACY_PREFIXES) and entry.is_dir():
                    self._sweep_entry(entry, cutoff, report, locked=False)
        if report.spool_entries or report.objects:
            log.info("swept orphaned uploads", extra={
                "spool_entries": report.spool_entries, "spool_bytes": report.spool_bytes,
                "objects": report.objects, "object_bytes": report.object_bytes})
        return report

    def _sweep_entry(self, entry: Path, cutoff: float, report: SweepReport, *,
                     locked: bool = True) -> None:
        try:
            if _newest_mtime(entry) > cutoff:
                return
            if not (entry.is_dir() and not entry.is_symlink()):
                self._count_spool(entry, report)
                entry.unlink(missing_ok=True)
                return
            fd = _try_lock(entry) if locked else None
            if locked and fd is None:
                return  # a live upload holds it
            try:
                for key in read_intent(entry):
                    self._sweep_object(entry.name, key, report)
                self._count_spool(entry, report)
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                if fd is not None:
                    os.close(fd)
        except FileNotFoundError:
            return  # another sweeper (or the upload itself) removed it meanwhile

    def _count_spool(self, entry: Path, report: SweepReport) -> None:
        size = _size(entry)
        report.spool_entries += 1
        report.spool_bytes += size
        log.info("swept staged upload", extra={"spool_entry": entry.name, "bytes": size})
        if self.metrics is not None:
            self.metrics.swept.labels(kind="spool").inc()
            self.metrics.swept_bytes.labels(kind="spool").inc(size)

    def _sweep_object(self, folder: str, key: str, report: SweepReport) -> None:
        with self.sessions() as session:
            if _committed(session, key):
                return
        info = self.store.stat(key)
        if info is None:
            return  # never written, or the failed upload deleted it itself
        self.store.delete(key)
        report.objects += 1
        report.object_bytes += info.size
        log.info("swept orphaned object", extra={"spool_entry": folder, "object_key": key,
                                                 "bytes": info.size})
        if self.metrics is not None:
            self.metrics.swept.labels(kind="object").inc()
            self.metrics.swept_bytes.labels(kind="object").inc(info.size)

    def start(self) -> None:
        """Sweep every ``interval_s`` in a daemon thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dpsynth-sweeper",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits for a sweep in progress)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception:  # a store or database hiccup: the next pass retries
                log.exception("the upload sweep failed")


__all__ = ["LEGACY_PREFIXES", "SweepReport", "Sweeper"]
