"""Safe reading of uploaded zip and tar archives (datasets and models).

Everything is checked from the archive's headers BEFORE a byte is inflated: member names
(no absolute paths, no ``..``), member types (no symlinks, hard links or devices), the member
count (a zip's from its end record, before its directory is parsed) and the total declared
uncompressed size against the upload's allowance (decompression bombs: an absolute cap and a
compression-ratio limit, :mod:`dpsynth_api.inflation`). Members are then streamed, never
read whole past ``max_member_bytes``, and every inflated byte is counted against the same
allowance as it is inflated, so a header that lies is caught as early as an honest one (zip
also checks each member's CRC and length). A compressed tar is decompressed by our own
metered stream, not by ``tarfile``: ``tarfile`` would read a pax header of any declared
size whole. Nothing is ever extracted to disk under the archive's own names.

Error messages name a member only for public uploads (``private=False``): a private
dataset's file names are private data (docs/privacy.md), so its errors only count.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.inflation import ArchiveLimits, Inflation, MeteredStream, member_too_large

_DRIVE = re.compile(r"^[A-Za-z]:")
_CHUNK = 1 << 20
_TAR_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError, ValueError, lzma.LZMAError)
# zipfile raises NotImplementedError for a compression method it does not support: that is
# a bad upload (422), not an unfinished feature of ours.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, OSError,
               NotImplementedError, ValueError, lzma.LZMAError)
_READ_ERRORS = tuple(set(_TAR_ERRORS) | set(_ZIP_ERRORS))
_COMPRESSED_TAR = ((b"\x1f\x8b", "gz"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))
_EOCD, _EOCD64_LOCATOR = b"PK\x05\x06", b"PK\x06\x07"


@dataclass(frozen=True)
class MemberInfo:
    name: str  # normalised relative posix path
    size: int


def describe(name: str, *, private: bool) -> str:
    """How an error message refers to a member: by name only for public uploads."""
    return "a member" if private else f"member {name!r}"


def safe_member_name(raw: str, *, private: bool) -> str:
    """Normalise a member name, refusing absolute paths and ``..`` (422 ``unsafe_archive``)."""
    name = raw.replace("\\", "/")
    if name.startswith("/") or _DRIVE.match(name):
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                           f"{describe(raw, private=private)} has an absolute path")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                           f"{describe(raw, private=private)} escapes the archive with '..'")
    return "/".join(parts)


def zip_entry_count(path: Path) -> int | None:
    """The number of entries a zip's end record declares (zip64 too), read before the
    central directory is parsed (``zipfile`` builds one object per entry); None if absent."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        tail_len = min(size, 22 + 0xFFFF + 20)  # end record, longest comment, zip64 locator
        fh.seek(size - tail_len)
        tail = fh.read(tail_len)
        at = tail.rfind(_EOCD)
        if at < 0 or at + 22 > len(tail):
            return None
        (count,) = struct.unpack("<H", tail[at + 10:at + 12])
        locator = tail[at - 20:at] if at >= 20 else b""
        if count != 0xFFFF or not locator.startswith(_EOCD64_LOCATOR):
            return int(count)
        (offset,) = struct.unpack("<Q", locator[8:16])
        fh.seek(offset)
        record = fh.read(56)
    if len(record) < 40:
        return None
    return int(struct.unpack("<Q", record[32:40])[0])


def _check_count(count: int, limits: ArchiveLimits) -> None:
    if count > limits.max_members:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                           f"the archive has more than {limits.max_members} members",
                           limit=limits.max_members)


def _tar_compression(path: Path) -> str | None:
    with path.open("rb") as fh:
        head = fh.read(6)
    return next((kind for magic, kind in _COMPRESSED_TAR if head.startswith(magic)), None)


class _HeaderByHeaderTar(tarfile.TarFile):
    """A tar read forward that keeps no list of the headers it has passed (``tarfile``
    keeps every one, which grows with the member count)."""

    def next(self) -> tarfile.TarInfo | None:
        info = super().next()
        self.members: list[tarfile.TarInfo] = []
        return info


@contextmanager
def _open_tar(path: Path, meter: Inflation) -> Iterator[tarfile.TarFile]:
    """A tar (plain, gzip, bzip2 or xz) read through a metered decompressed stream."""
    with path.open("rb") as raw:
        kind = _tar_compression(path)
        inner: BinaryIO = raw
        if kind == "gz":
            inner = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        elif kind == "bz2":
            inner = bz2.BZ2File(raw)  # type: ignore[assignment]
        elif kind == "xz":
            inner = lzma.LZMAFile(raw)  # type: ignore[assignment]
        stream = MeteredStream(inner, meter)
        with _HeaderByHeaderTar.open(fileobj=stream, mode="r:") as tf:
            yield tf


def detect_kind(path: Path, limits: ArchiveLimits) -> Literal["zip", "tar"]:
    """``zip`` or ``tar`` (plain, gzip, bzip2, xz), else 422 ``invalid_archive``."""
    if zipfile.is_zipfile(path):
        return "zip"
    try:
        with _open_tar(path, Inflation(limits, path.stat().st_size)):
            return "tar"
    except DpsynthError:
        raise
    except _TAR_ERRORS:
        pass
    raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the upload is not a readable zip or tar archive")


class MemberStream:
    """One member's data: reads at most 1 MiB at a time, counted against the upload's
    allowance (``meter``; a tar's bytes are counted by its decompressed stream already),
    and a corrupt member (bad CRC, truncated data) is 422 ``invalid_archive``."""

    def __init__(self, fh: IO[bytes], meter: Inflation | None) -> None:
        self._fh, self._meter = fh, meter

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._fh.read(_CHUNK if size is None or size < 0 else min(size, _CHUNK))
        except DpsynthError:
            raise
        except _READ_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "an archive member is corrupt") from exc
        if self._meter is not None:
            self._meter.add(len(data))
        return data


def read_whole(stream: MemberStream, size: int, limits: ArchiveLimits, *,
               where: str) -> bytes:
    """A member's bytes, read in chunks: refused unread above ``max_member_bytes`` and
    ``invalid_archive`` when the data is longer or shorter than its header says."""
    if size > limits.max_member_bytes:
        raise member_too_large(limits, where)
    chunks, got = [], 0
    while got <= size and (chunk := stream.read(min(_CHUNK, size + 1 - got))):
        chunks.append(chunk)
        got += len(chunk)
    if got != size:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, f"{where} is not as long as its header "
                           "says")
    return b"".join(chunks)


def read_exactly(stream: MemberStream, n: int) -> bytes:
    """The next ``n`` bytes of ``stream`` (fewer only at its end)."""
    chunks, got = [], 0
    while got < n and (chunk := stream.read(n - got)):
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class SafeArchive:
    """A zip or tar archive whose headers were checked; iterate its regular files.

    Args:
        path: the uploaded file.
        limits: caps on members, inflated bytes (absolute and by ratio) and member size.
        private: whether error messages must not name members.

    Raises:
        DpsynthError: ``invalid_archive`` (corrupt) or ``unsafe_archive`` (unsafe).
    """

    def __init__(self, path: Path, limits: ArchiveLimits, *, private: bool) -> None:
        self.path = path
        self.limits = limits
        self.private = private
        self.kind = detect_kind(path, limits)
        self.members = self._scan_zip() if self.kind == "zip" else self._scan_tar()

    def _meter(self) -> Inflation:
        return Inflation(self.limits, self.path.stat().st_size)

    def _scan_zip(self) -> list[MemberInfo]:
        _check_count(zip_entry_count(self.path) or 0, self.limits)
        try:
            with zipfile.ZipFile(self.path) as zf:
                infos = zf.infolist()
        except _ZIP_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the zip archive is corrupt") from exc
        _check_count(len(infos), self.limits)
        self._meter().check_declared(sum(i.file_size for i in infos))
        members = []
        for info in infos:
            name = safe_member_name(info.filename, private=self.private)
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                                   f"{describe(info.filename, private=self.private)} is a link "
                                   "or a special file")
            if not info.is_dir() and name:
                members.append(MemberInfo(name, info.file_size))
        return members

    def _scan_tar(self) -> list[MemberInfo]:
        members, count, total = [], 0, 0
        declared = self._meter()
        try:
            with _open_tar(self.path, self._meter()) as tf:
                # Headers one by one: stop at the caps before reading further.
                while (info := tf.next()) is not None:
                    count, total = count + 1, total + max(info.size, 0)
                    _check_count(count, self.limits)
                    declared.check_declared(total)
                    name = safe_member_name(info.name, private=self.private)
                    if not (info.isfile() or info.isdir()):
                        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                                           f"{describe(info.name, private=self.private)} is a "
                                           "link or a device, which archives may not contain")
                    if info.isfile() and name:
                        members.append(MemberInfo(name, info.size))
        except _TAR_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the tar archive is corrupt") from exc
        return members

    def iter_members(self) -> Iterator[tuple[str, int, MemberStream]]:
        """``(name, size, stream)`` of each regular file, in archive order; every byte read
        from a stream is counted against the upload's allowance."""
        if self.kind == "zip":
            yield from self._iter_zip()
        else:
            yield from self._iter_tar()

    def iter_files(self) -> Iterator[tuple[str, bytes]]:
        """``(name, bytes)`` of each regular file, each at most ``max_member_bytes``."""
        for name, size, stream in self.iter_members():
            yield name, read_whole(stream, size, self.limits,
                                   where=describe(name, private=self.private))

    def _iter_zip(self) -> Iterator[tuple[str, int, MemberStream]]:
        meter = self._meter()
        try:
            with zipfile.ZipFile(self.path) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    name = safe_member_name(info.filename, private=self.private)
                    with zf.open(info) as fh:
                        yield name, info.file_size, MemberStream(fh, meter)
        except _ZIP_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the zip archive is corrupt") from exc

    def _iter_tar(self) -> Iterator[tuple[str, int, MemberStream]]:
        try:
            with _open_tar(self.path, self._meter()) as tf:
                while (info := tf.next()) is not None:
                    if not info.isfile():
                        continue
                    fh = tf.extractfile(info)
                    if fh is None:
                        continue
                    yield (safe_member_name(info.name, private=self.private), info.size,
                           MemberStream(fh, None))
        except _TAR_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the tar archive is corrupt") from exc


__all__ = ["ArchiveLimits", "MemberInfo", "MemberStream", "SafeArchive", "describe", "detect_kind",
           "read_exactly", "read_whole", "safe_member_name", "zip_entry_count"]
