"""A local-directory object store (the embedded mode's only difference from production).

Objects are plain files under ``root``; each key maps to ``root/<key>``. Writes go to a
temp file in the target folder, are fsynced and moved into place with :func:`os.replace`
(atomic on POSIX), then the folder is fsynced, so a crash leaves either the old or the new
object, never a torn one. The sha256 is computed while writing and kept in a sidecar under
``root/.meta/`` (keys may not have hidden segments, so sidecars and temp files can never
collide with an object).

Presigned URLs: after the same corpora-only check as the S3 store,
:meth:`LocalDirStore.presign_get` returns the path ``/v1/presigned/<token>`` (the api makes
it absolute and serves it). The token is opaque: the object key and the expiry, encrypted
and authenticated (AES-GCM) with a key of this store, so the URL reveals neither the
server's file path nor the key, and cannot be forged or altered;
:meth:`LocalDirStore.resolve_presigned` turns a valid, unexpired token back into the key.
Without a configured ``presign_secret`` the key is random per process: URLs then stay
valid only as long as the api process that issued them (the embedded mode runs one).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.object_store import ObjectInfo, check_presign_allowed, check_read_access
from dpsynth_shared.stores.keys import validate_key

_META_DIR = ".meta"
_COPY_CHUNK = 1 << 20
PRESIGNED_PATH = "/v1/presigned/"
_PRESIGN_AAD = b"dpsynth-local-presign-v1"
_PRESIGN_MAX_TTL_S = 3600


def _invalid_presigned() -> DpsynthError:
    return DpsynthError(ErrorCode.NOT_FOUND, "this presigned URL is invalid or has expired",
                        resource="presigned URL")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(dest: Path, source: BinaryIO | None, data: bytes | None) -> tuple[int, str]:
    """Write ``source`` (or ``data``) to ``dest`` atomically; return (size, sha256 hex)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            chunks: Iterator[bytes] = (
                iter(lambda: source.read(_COPY_CHUNK), b"") if source is not None
                else iter([data or b""])
            )
            for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp_name, dest)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)
    return size, digest.hexdigest()


class LocalDirStore:
    """:class:`~dpsynth_shared.object_store.ObjectStore` over a local folder.

    Args:
        root: the folder holding the objects (created if missing).
        grant_public_key: the ledger's Ed25519 public key; without it, private objects
            cannot be read at all (every grant is refused).
        presign_secret: the secret presigned-URL tokens are sealed with (random per
            instance when not given).
    """

    def __init__(self, root: Path, *,
                 grant_public_key: str | Sequence[str] | None = None,
                 presign_secret: bytes | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._public_key = grant_public_key
        secret = presign_secret if presign_secret is not None else secrets.token_bytes(32)
        self._presign_aead = AESGCM(hashlib.sha256(_PRESIGN_AAD + secret).digest())

    # -- paths ---------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        path = self.root / validate_key(key)
        # validate_key already forbids '..'; this is a second, independent guard.
        if self.root not in path.resolve().parents:
            raise NotFound("object", key)
        return path

    def _meta_path(self, key: str) -> Path:
        return self.root / _META_DIR / f"{key}.json"

    def _record(self, key: str, path: Path, size: int, sha256: str) -> ObjectInfo:
        meta = {"sha256": sha256, "size": size, "mtime_ns": path.stat().st_mtime_ns}
        _write_atomic(self._meta_path(key), None, json.dumps(meta).encode())
        return ObjectInfo(key=key, size=size, sha256=sha256)

    # -- writes --------------------------------------------------------------------------
    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Copy the local file ``path`` to ``key`` (atomic, fsynced)."""
        dest = self._path(key)
        with open(path, "rb") as source:
            size, sha = _write_atomic(dest, source, None)
        return self._record(key, dest, size, sha)

    def put_bytes(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Store ``data`` under ``key`` (atomic, fsynced)."""
        dest = self._path(key)
        size, sha = _write_atomic(dest, None, data)
        return self._record(key, dest, size, sha)

    # -- reads ---------------------------------------------------------------------------
    def _open_checked(self, key: str, grant: str | None) -> Path:
        path = self._path(key)
        check_read_access(key, grant, self._public_key)
        if not path.is_file():
            raise NotFound("object", key)
        return path

    def get_file(self, key: str, dest: Path, *, grant: str | None = None) -> ObjectInfo:
        """Copy ``key`` to the local file ``dest`` (atomic); needs a grant for private keys."""
        path = self._open_checked(key, grant)
        with open(path, "rb") as source:
            size, sha = _write_atomic(Path(dest), source, None)
        return ObjectInfo(key=key, size=size, sha256=sha)

    def iter_chunks(
        self, key: str, *, grant: str | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        """Stream ``key`` in chunks. Access is checked now, not at the first ``next()``."""
        path = self._open_checked(key, grant)
        handle = open(path, "rb")

        def _chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(chunk_size):
                    yield chunk

        return _chunks()

    def stat(self, key: str) -> ObjectInfo | None:
        """Size and sha256 of ``key``, or ``None`` when it does not exist."""
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(self._meta_path(key).read_text())
            if meta["size"] == st.st_size and meta["mtime_ns"] == st.st_mtime_ns:
                return ObjectInfo(key=key, size=st.st_size, sha256=meta["sha256"])
        except (OSError, ValueError, KeyError):
            pass
        # The sidecar is missing or stale (file replaced outside the store): rehash.
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_COPY_CHUNK), b""):
                digest.update(chunk)
        return self._record(key, path, st.st_size, digest.hexdigest())

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it does not exist)."""
        self._path(key).unlink(missing_ok=True)
        self._meta_path(key).unlink(missing_ok=True)

    def presign_get(self, key: str, *, ttl: timedelta) -> str:
        """``/v1/presigned/<opaque token>`` for a corpus, valid ``ttl`` (at most an hour);
        the api serves it. Neither the file path nor the key can be read from it.

        Raises:
            DpsynthError: ``presign_refused`` for any key outside ``corpora/``;
                ``not_found`` when the object does not exist.
        """
        path = self._path(key)
        check_presign_allowed(key)
        if not path.is_file():
            raise NotFound("object", key)
        ttl_s = min(max(ttl.total_seconds(), 0.0), _PRESIGN_MAX_TTL_S)
        claims = json.dumps({"k": key, "e": round(time.time() + ttl_s, 3)}).encode()
        nonce = os.urandom(12)
        sealed = nonce + self._presign_aead.encrypt(nonce, claims, _PRESIGN_AAD)
        return PRESIGNED_PATH + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def resolve_presigned(self, token: str) -> str:
        """The key a token of :meth:`presign_get` names.

        Raises:
            DpsynthError: ``not_found`` when the token is malformed, forged, altered,
                expired, or names a key that may not be presigned (all answered alike).
        """
        try:
            sealed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            claims = json.loads(self._presign_aead.decrypt(sealed[:12], sealed[12:],
                                                           _PRESIGN_AAD))
            key, expires = str(claims["k"]), float(claims["e"])
        except (ValueError, binascii.Error, InvalidTag, KeyError, TypeError):
            raise _invalid_presigned() from None
        if expires <= time.time():
            raise _invalid_presigned()
        try:
            check_presign_allowed(key)
        except Exception:  # noqa: BLE001 - a sealed token never names one; answer alike
            raise _invalid_presigned() from None
        return key
