"""Streaming a stored model tar as the zip a user uploads: re-packed on the fly, in bounded
memory (one chunk of the tar in, the zip's bytes out as they are written)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterable, Iterator

from dpsynth_api.archives import safe_member_name

_CHUNK = 1 << 20
_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: the same model always streams the same bytes


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (what tarfile's stream mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: memoryview) -> int:  # type: ignore[override]
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


class _Sink:
    """A write-only, unseekable file whose bytes are taken out as they come."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def drain(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def tar_to_zip(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The zip of the regular files of a tar given as byte chunks, as byte chunks.

    Weights (``.safetensors``) are stored, other files deflated; directories, links and
    other member types are skipped. Member names are checked like upload names.
    """
    sink = _Sink()
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar, \
            zipfile.ZipFile(sink, mode="w", allowZip64=True) as out:
        for member in tar:
            if not member.isfile():
                continue
            name = safe_member_name(member.name, private=False)
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.compress_type = (zipfile.ZIP_STORED if name.endswith(".safetensors")
                                  else zipfile.ZIP_DEFLATED)
            info.external_attr = 0o100644 << 16
            info.file_size = member.size
            source = tar.extractfile(member)
            assert source is not None
            with out.open(info, mode="w") as dest:
                while block := source.read(_CHUNK):
                    dest.write(block)
                    if data := sink.drain():
                        yield data
            if data := sink.drain():
                yield data
    if data := sink.drain():
        yield data
