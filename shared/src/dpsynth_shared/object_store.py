"""The object-store port.

Adapters: :class:`dpsynth_shared.stores.local.LocalDirStore` (embedded mode) and
:class:`dpsynth_shared.stores.s3.S3Store` (MinIO client, any S3 endpoint). Both pass one
contract test suite (``tests/integration/test_object_store_contract.py``).

Keys under ``private/`` hold private data: reading one needs a read grant signed by the
ledger for that dataset (:mod:`dpsynth_shared.grants`), checked by the adapter with the
ledger's public key. Writes need no grant (the api writes uploads; workers write outputs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.grants import verify_grant

PRIVATE_PREFIX = "private/"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str


_BINARY = "application/octet-stream"


class ObjectStore(Protocol):
    """Where datasets, models, checkpoints and corpora live (see the module docstring)."""

    def put_file(self, key: str, path: Path, *, content_type: str = _BINARY) -> ObjectInfo: ...
    def put_bytes(self, key: str, data: bytes, *, content_type: str = _BINARY) -> ObjectInfo: ...
    def get_file(self, key: str, dest: Path, *, grant: str | None = None) -> ObjectInfo: ...
    def iter_chunks(self, key: str, *, grant: str | None = None,
                    chunk_size: int = 1 << 20) -> Iterator[bytes]: ...
    def stat(self, key: str) -> ObjectInfo | None: ...
    def delete(self, key: str) -> None: ...
    def presign_get(self, key: str, *, ttl: timedelta) -> str: ...


def check_read_access(key: str, grant: str | None,
                      public_key: str | Sequence[str] | None) -> None:
    """Refuse a read of a private object without a valid grant for its dataset.

    Raises:
        DpsynthError: ``read_grant_required`` / ``invalid_grant``.
    """
    if not key.startswith(PRIVATE_PREFIX):
        return
    if grant is None:
        raise DpsynthError(ErrorCode.GRANT_REQUIRED, "private objects are readable only with a "
                           "read grant from the ledger")
    if not public_key:
        raise DpsynthError(ErrorCode.INVALID_GRANT, "this store has no grant verification key")
    claims = verify_grant(grant, public_key)
    if not key.startswith(claims.prefix):
        raise DpsynthError(ErrorCode.INVALID_GRANT, "read grant does not cover this object")


def check_presign_allowed(key: str) -> None:
    """Presigned URLs are for synthetic corpora only; private data is never presigned."""
    if not key.startswith("corpora/"):
        raise DpsynthError(ErrorCode.PRESIGN_REFUSED, "only synthetic corpora can be presigned")
