"""Counting the bytes an upload inflates to, as they are inflated (issue 14, item 7).

A compressed upload is a promise about its size that only the decompressor can check: a
1 MB ``.tar.gz`` can declare, or simply contain, gigabytes. Every reader of an uploaded
archive therefore draws its inflated bytes through one :class:`Inflation` meter per upload,
which refuses (422 ``unsafe_archive``) as soon as the running total passes the upload's
*allowance*: the absolute cap ``max_uncompressed_bytes``, tightened by a compression-ratio
limit (``max_ratio`` times the compressed size, never below ``ratio_floor_bytes`` so that
small, highly compressible uploads stay legal). Declared sizes (archive headers) are checked
against the same allowance first, so an honest bomb is refused before a byte is inflated;
the running count catches the dishonest ones.

:class:`MeteredStream` wraps a decompressed stream (gzip, bzip2, xz) for ``tarfile``: no
single read may exceed ``max_member_bytes`` (``tarfile`` reads a pax or GNU long-name
header whole, whatever size it declares), and a forward seek is refused before it inflates
past the allowance.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

from dpsynth_shared.errors import DpsynthError, ErrorCode

_MiB = 1 << 20
DEFAULT_MAX_MEMBER_BYTES = 64 * _MiB
DEFAULT_MAX_RATIO = 200.0
DEFAULT_RATIO_FLOOR_BYTES = 64 * _MiB


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on what an upload may inflate to (settings: ``ApiSettings``).

    Attributes:
        max_uncompressed_bytes: the most bytes any upload inflates to (and the most bytes
            its decoded images may take in memory).
        max_members: the most members (files, directories) of an archive.
        max_member_bytes: the most bytes one member read into memory may have (an image,
            a config), and the largest single read from a decompressed stream.
        max_ratio: the most an upload may inflate relative to its compressed size.
        ratio_floor_bytes: inflating up to this many bytes is allowed whatever the ratio.
    """

    max_uncompressed_bytes: int
    max_members: int
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    max_ratio: float = DEFAULT_MAX_RATIO
    ratio_floor_bytes: int = DEFAULT_RATIO_FLOOR_BYTES

    def allowance(self, compressed_bytes: int) -> int:
        """The most bytes an upload of ``compressed_bytes`` may inflate to."""
        by_ratio = max(self.ratio_floor_bytes, int(self.max_ratio * compressed_bytes))
        return min(self.max_uncompressed_bytes, by_ratio)


def bomb(limits: ArchiveLimits, compressed_bytes: int, *, what: str = "the archive"
         ) -> DpsynthError:
    """The 422 ``unsafe_archive`` problem of an upload inflating past its allowance."""
    cap = limits.allowance(compressed_bytes)
    if cap < limits.max_uncompressed_bytes:
        detail = (f"{what} inflates more than {limits.max_ratio:g} times its "
                  f"{compressed_bytes} compressed bytes (limit {cap} bytes; decompression "
                  "bomb?)")
        return DpsynthError(ErrorCode.UNSAFE_ARCHIVE, detail, limit=cap,
                            max_ratio=limits.max_ratio)
    return DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"{what} inflates past the limit of {cap} "
                        "bytes (decompression bomb?)", limit=cap)


def member_too_large(limits: ArchiveLimits, where: str) -> DpsynthError:
    """The 422 ``unsafe_archive`` problem of a member too large to read into memory."""
    return DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"{where} is larger than the per-member "
                        f"limit of {limits.max_member_bytes} bytes",
                        limit=limits.max_member_bytes)


class Inflation:
    """The running count of one upload's inflated bytes against its allowance."""

    def __init__(self, limits: ArchiveLimits, compressed_bytes: int) -> None:
        self.limits = limits
        self.compressed_bytes = compressed_bytes
        self.cap = limits.allowance(compressed_bytes)
        self.total = 0

    def check_declared(self, declared_total: int) -> None:
        """Refuse headers whose declared sizes already pass the allowance."""
        if declared_total > self.cap:
            raise bomb(self.limits, self.compressed_bytes)

    def add(self, n: int) -> None:
        """Count ``n`` more inflated bytes; refuse once past the allowance."""
        self.total += n
        if self.total > self.cap:
            raise bomb(self.limits, self.compressed_bytes)


class MeteredStream(io.RawIOBase):
    """A read-only view of a decompressed stream that meters its position.

    The position (bytes inflated so far) is counted into ``meter`` (never twice for the
    same byte); reads over ``max_member_bytes`` and seeks past the allowance are refused
    before the inner stream inflates anything, so one read overshoots the allowance by at
    most ``max_member_bytes``.
    """

    def __init__(self, inner: BinaryIO, meter: Inflation) -> None:
        super().__init__()
        self._inner = inner
        self._meter = meter
        self._counted = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._inner.tell()

    def _count_to(self, position: int) -> None:
        if position > self._counted:
            self._meter.add(position - self._counted)
            self._counted = position

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > self._meter.limits.max_member_bytes:
            raise member_too_large(self._meter.limits, "a header or member of the archive")
        data = self._inner.read(size)
        self._count_to(self._inner.tell())
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("only absolute and relative seeks")
        target = offset if whence == io.SEEK_SET else self._inner.tell() + offset
        if target - self._counted > self._meter.cap - self._meter.total:
            raise bomb(self._meter.limits, self._meter.compressed_bytes)
        position = self._inner.seek(target)
        self._count_to(position)
        return position


__all__ = ["ArchiveLimits", "Inflation", "MeteredStream", "bomb", "member_too_large"]
