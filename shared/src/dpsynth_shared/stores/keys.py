"""Object-key validation shared by every store adapter.

Keys are ``/``-separated relative paths (``private/datasets/{id}/data.npz``). The local
store maps them to files, so a key that could escape the root or alias another key is
refused everywhere, which keeps both adapters answering the contract tests the same way.
"""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode

MAX_KEY_LENGTH = 1024


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe object key, else raise.

    Refused: empty keys, absolute keys, backslashes, NUL bytes, empty segments
    (``a//b``, trailing ``/``), and segments starting with ``.`` (``.``, ``..`` and hidden
    names, which the local store reserves for its temp files and metadata).

    Raises:
        DpsynthError: ``invalid_request`` for a refused key.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "object key is empty or too long")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "object key must be a relative POSIX path")
    for segment in key.split("/"):
        if not segment or segment.startswith("."):
            raise DpsynthError(
                ErrorCode.INVALID_REQUEST,
                "object key has an empty, '.'/'..' or hidden segment",
            )
    return key
