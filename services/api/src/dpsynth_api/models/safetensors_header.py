"""Checking a safetensors weights file from its header, without loading it.

An uploaded model's weights are never deserialised by the api: their header (an 8-byte
little-endian length, then a JSON table of tensors) is read from the archive stream and
checked (dtypes, shapes, offsets tiling the buffer, a bound on the number of values) while
the weights themselves are streamed into the stored tar (:mod:`dpsynth_api.models.validation`).
"""

from __future__ import annotations

import json
import math
import struct

from dpsynth_shared.errors import DpsynthError

from dpsynth_api.archives import MemberStream, read_exactly
from dpsynth_api.models.info_file import invalid_model as _invalid

_MAX_HEADER_BYTES = 8 << 20
_MAX_TENSORS = 100_000
#: safetensors dtypes a model's weights may use, with their sizes in bytes.
DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def check_safetensors(data: bytes, *, name: str, max_elements: int) -> int:
    """Check a safetensors file without loading it; returns its number of elements
    (:func:`check_safetensors_head` on a file held whole)."""
    return check_safetensors_head(data, len(data), name=name, max_elements=max_elements)


def read_safetensors_head(stream: MemberStream, size: int, *, name: str) -> bytes:
    """The first bytes of a safetensors member up to the end of its header (at most
    ``8 + _MAX_HEADER_BYTES``): all :func:`check_safetensors_head` needs, so the weights
    themselves are streamed, never held whole (issue 14, item 7)."""
    prefix = read_exactly(stream, min(8, size))
    if len(prefix) < 8:
        return prefix
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
        return prefix  # refused by check_safetensors_head with its message
    return prefix + read_exactly(stream, header_len)


def check_safetensors_head(data: bytes, size: int, *, name: str, max_elements: int) -> int:
    """Check a safetensors file of ``size`` bytes from its first bytes (``data``: at least
    the length prefix and the header); returns its number of elements.

    The format is an 8-byte little-endian header length N, N bytes of JSON mapping tensor
    names to ``{dtype, shape, data_offsets: [begin, end]}`` (offsets relative to the byte
    buffer after the header), then the buffer. The tensors must tile the buffer exactly:
    sorted by offset, contiguous, non-overlapping, inside the file, each exactly
    ``prod(shape) * itemsize`` bytes (what the safetensors library itself requires).

    Raises:
        DpsynthError: 422 ``invalid_model`` naming the file and the defect.
    """
    def bad(why: str) -> DpsynthError:
        return _invalid(f"{name} is not a valid safetensors file: {why}", file=name)

    if len(data) < 8:
        raise bad("shorter than its 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _MAX_HEADER_BYTES:
        raise bad(f"its header declares {header_len} bytes, over the limit of "
                  f"{_MAX_HEADER_BYTES}")
    if 8 + header_len > size:
        raise bad("its header runs past the end of the file")
    raw = data[8:8 + header_len]
    if not raw.lstrip().startswith(b"{"):
        raise bad("its header is not a JSON object")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad("its header is not valid UTF-8 JSON") from exc
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise bad("__metadata__ must map strings to strings")
    if len(header) > _MAX_TENSORS:
        raise bad(f"it has more than {_MAX_TENSORS} tensors")
    buffer = size - 8 - header_len
    spans: list[tuple[int, int, str]] = []
    elements = 0
    for tensor, desc in header.items():
        if not isinstance(desc, dict) or set(desc) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {tensor!r} must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = desc["dtype"], desc["shape"], desc["data_offsets"]
        if dtype not in DTYPES:
            raise bad(f"tensor {tensor!r} has dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= 8 and all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)):
            raise bad(f"tensor {tensor!r} has an invalid shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise bad(f"tensor {tensor!r} has invalid data_offsets")
        begin, end = offsets
        count = math.prod(shape)
        if not 0 <= begin <= end <= buffer:
            raise bad(f"tensor {tensor!r} has offsets [{begin}, {end}] outside the "
                      f"{buffer}-byte buffer")
        if end - begin != count * DTYPES[dtype]:
            raise bad(f"tensor {tensor!r} spans {end - begin} bytes, its shape and dtype "
                      f"need {count * DTYPES[dtype]}")
        elements += count
        spans.append((begin, end, tensor))
    spans.sort()
    position = 0
    for begin, end, tensor in spans:
        if begin != position:
            what = "overlaps the previous tensor" if begin < position else "leaves a gap"
            raise bad(f"tensor {tensor!r} {what} (offset {begin}, expected {position})")
        position = end
    if position != buffer:
        raise bad(f"the tensors cover {position} of the {buffer} buffer bytes")
    if elements > max_elements:
        raise bad(f"it holds {elements:,} values, over the limit of {max_elements:,}")
    return elements
