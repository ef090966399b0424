"""Safe reading of uploaded zip and tar archives (datasets and models).

Everything is checked from the archive's headers BEFORE a byte is inflated: member names
(no absolute paths, no ``..``), member types (no symlinks, hard links or devices), the member
count and the total declared uncompressed size (decompression bombs). Reads are then bounded
by the declared sizes (zip checks each member's CRC and length). Nothing is ever extracted to
disk under the archive's own names.

Error messages name a member only for public uploads (``private=False``): a private
dataset's file names are private data (docs/privacy.md), so its errors only count.
"""

from __future__ import annotations

import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode

_DRIVE = re.compile(r"^[A-Za-z]:")
_TAR_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError, ValueError)
# zipfile raises NotImplementedError for a compression method it does not support: that is
# a bad upload (422), not an unfinished feature of ours.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, OSError,
               NotImplementedError, ValueError)


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps checked before inflating anything."""

    max_uncompressed_bytes: int
    max_members: int


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


def detect_kind(path: Path) -> Literal["zip", "tar"]:
    """``zip`` or ``tar`` (any compression tarfile reads), else 422 ``invalid_archive``."""
    if zipfile.is_zipfile(path):
        return "zip"
    try:
        if tarfile.is_tarfile(path):
            return "tar"
    except _TAR_ERRORS:
        pass
    raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the upload is not a readable zip or tar archive")


def _check_caps(count: int, total: int, limits: ArchiveLimits) -> None:
    if count > limits.max_members:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                           f"the archive has more than {limits.max_members} members",
                           limit=limits.max_members)
    if total > limits.max_uncompressed_bytes:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                           "the archive inflates past the limit of "
                           f"{limits.max_uncompressed_bytes} bytes (decompression bomb?)",
                           limit=limits.max_uncompressed_bytes)


class SafeArchive:
    """A zip or tar archive whose headers were checked; iterate its regular files.

    Args:
        path: the uploaded file.
        limits: caps on members and inflated bytes.
        private: whether error messages must not name members.

    Raises:
        DpsynthError: ``invalid_archive`` (corrupt) or ``unsafe_archive`` (unsafe).
    """

    def __init__(self, path: Path, limits: ArchiveLimits, *, private: bool) -> None:
        self.path = path
        self.private = private
        self.kind = detect_kind(path)
        self.members = self._scan_zip(limits) if self.kind == "zip" else self._scan_tar(limits)

    def _scan_zip(self, limits: ArchiveLimits) -> list[MemberInfo]:
        try:
            with zipfile.ZipFile(self.path) as zf:
                infos = zf.infolist()
        except _ZIP_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the zip archive is corrupt") from exc
        _check_caps(len(infos), sum(i.file_size for i in infos), limits)
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

    def _scan_tar(self, limits: ArchiveLimits) -> list[MemberInfo]:
        members, count, total = [], 0, 0
        try:
            with tarfile.open(self.path, mode="r:*") as tf:
                # Headers one by one: stop at the caps before reading further.
                while (info := tf.next()) is not None:
                    count, total = count + 1, total + max(info.size, 0)
                    _check_caps(count, total, limits)
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

    def iter_files(self) -> Iterator[tuple[str, bytes]]:
        """``(name, bytes)`` of each regular file, in archive order, reads bounded by size."""
        if self.kind == "zip":
            yield from self._iter_zip()
        else:
            yield from self._iter_tar()

    def _iter_zip(self) -> Iterator[tuple[str, bytes]]:
        try:
            with zipfile.ZipFile(self.path) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    name = safe_member_name(info.filename, private=self.private)
                    with zf.open(info) as fh:
                        data = fh.read(info.file_size + 1)
                    if len(data) != info.file_size:
                        raise zipfile.BadZipFile("size mismatch")
                    yield name, data
        except _ZIP_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the zip archive is corrupt") from exc

    def _iter_tar(self) -> Iterator[tuple[str, bytes]]:
        try:
            with tarfile.open(self.path, mode="r:*") as tf:
                while (info := tf.next()) is not None:
                    if not info.isfile():
                        continue
                    fh = tf.extractfile(info)
                    if fh is None:
                        continue
                    data = fh.read(info.size + 1)
                    if len(data) != info.size:
                        raise tarfile.TarError("truncated member")
                    yield safe_member_name(info.name, private=self.private), data
        except _TAR_ERRORS as exc:
            raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the tar archive is corrupt") from exc
