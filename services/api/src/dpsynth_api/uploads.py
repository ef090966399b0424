"""Streaming an upload to a temporary file while counting its bytes."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from dpsynth_shared.errors import DpsynthError, ErrorCode

_CHUNK = 1 << 20


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


__all__ = ["safe_filename", "spool", "too_large"]
