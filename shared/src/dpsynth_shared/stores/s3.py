"""An S3 object store over the MinIO Python client (MinIO, SeaweedFS, AWS S3, ...).

The sha256 of each object is computed before upload and stored as user metadata
(``x-amz-meta-sha256``), so :meth:`S3Store.stat` answers it without reading the object.
Presigned URLs are signed by a second client built for ``settings.public_endpoint`` (same
credentials and region): a SigV4 signature covers the ``Host`` header, so a URL signed for
the in-cluster endpoint would be refused when fetched through the public one.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from minio import Minio
from minio.error import S3Error

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.object_store import ObjectInfo, check_presign_allowed, check_read_access
from dpsynth_shared.settings import ObjectStoreSettings
from dpsynth_shared.stores.keys import validate_key

_SHA_META = "sha256"
_MISSING = {"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"}
_CHUNK = 1 << 20


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _client(endpoint: str, settings: ObjectStoreSettings) -> Minio:
    # Passing the region keeps presigning offline (no GetBucketLocation round trip), which
    # matters for the public endpoint: it may not be reachable from inside the cluster.
    return Minio(
        endpoint,
        access_key=settings.access_key.get_secret_value(),
        secret_key=settings.secret_key.get_secret_value(),
        secure=settings.secure,
        region=settings.region,
    )


class S3Store:
    """:class:`~dpsynth_shared.object_store.ObjectStore` on an S3 bucket.

    Args:
        settings: endpoint, credentials, bucket, public endpoint and presign TTL cap.
        grant_public_key: the ledger's Ed25519 public key used to verify read grants.
    """

    def __init__(
        self, settings: ObjectStoreSettings, *,
        grant_public_key: str | Sequence[str] | None = None
    ) -> None:
        if not settings.endpoint:
            raise ValueError("S3 object store needs settings.endpoint")
        self._settings = settings
        self._bucket = settings.bucket
        self._public_key = grant_public_key
        self._client = _client(settings.endpoint, settings)
        self._presign_client = (
            _client(settings.public_endpoint, settings) if settings.public_endpoint
            else self._client
        )
        if not self._client.bucket_exists(self._bucket):
            try:
                self._client.make_bucket(self._bucket, location=settings.region)
            except S3Error as exc:  # another process created it first
                if exc.code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise

    # -- writes --------------------------------------------------------------------------
    def put_file(
        self, key: str, path: Path, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Upload the local file ``path`` to ``key`` with its sha256 as metadata."""
        validate_key(key)
        sha = _sha256_of_file(Path(path))
        size = Path(path).stat().st_size
        self._client.fput_object(
            self._bucket, key, str(path), content_type=content_type,
            metadata={_SHA_META: sha},
        )
        return ObjectInfo(key=key, size=size, sha256=sha)

    def put_bytes(
        self, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> ObjectInfo:
        """Upload ``data`` to ``key`` with its sha256 as metadata."""
        validate_key(key)
        sha = hashlib.sha256(data).hexdigest()
        self._client.put_object(
            self._bucket, key, io.BytesIO(data), len(data), content_type=content_type,
            metadata={_SHA_META: sha},
        )
        return ObjectInfo(key=key, size=len(data), sha256=sha)

    # -- reads ---------------------------------------------------------------------------
    def _get(self, key: str, grant: str | None) -> Any:
        validate_key(key)
        check_read_access(key, grant, self._public_key)
        try:
            return self._client.get_object(self._bucket, key)
        except S3Error as exc:
            if exc.code in _MISSING:
                raise NotFound("object", key) from exc
            raise DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, f"object store: {exc.code}") from exc

    def get_file(self, key: str, dest: Path, *, grant: str | None = None) -> ObjectInfo:
        """Download ``key`` to ``dest`` (temp file + rename) and check its sha256.

        Raises:
            DpsynthError: ``read_grant_required``/``invalid_grant`` for private keys,
                ``not_found``, or ``internal_error`` when the bytes do not match the
                sha256 recorded at upload.
        """
        response = self._get(key, grant)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in response.stream(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            expected = response.headers.get(f"x-amz-meta-{_SHA_META}")
            if expected and expected != digest.hexdigest():
                raise DpsynthError(ErrorCode.INTERNAL, "object bytes do not match their sha256")
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            response.close()
            response.release_conn()
        return ObjectInfo(key=key, size=size, sha256=digest.hexdigest())

    def iter_chunks(
        self, key: str, *, grant: str | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        """Stream ``key``; access and existence are checked now, bytes flow lazily."""
        response = self._get(key, grant)

        def _chunks() -> Iterator[bytes]:
            try:
                yield from response.stream(chunk_size)
            finally:
                response.close()
                response.release_conn()

        return _chunks()

    def stat(self, key: str) -> ObjectInfo | None:
        """Size and sha256 of ``key`` (from metadata), or ``None`` when missing."""
        validate_key(key)
        try:
            info = self._client.stat_object(self._bucket, key)
        except S3Error as exc:
            if exc.code in _MISSING:
                return None
            raise
        sha = (info.metadata or {}).get(f"x-amz-meta-{_SHA_META}", "")
        return ObjectInfo(key=key, size=int(info.size or 0), sha256=sha)

    def delete(self, key: str) -> None:
        """Remove ``key`` (S3 deletes are idempotent)."""
        validate_key(key)
        self._client.remove_object(self._bucket, key)

    def presign_get(self, key: str, *, ttl: timedelta) -> str:
        """A GET URL for a corpus, signed for the public endpoint, valid ≤ presign_ttl_s.

        Raises:
            DpsynthError: ``presign_refused`` outside ``corpora/``; ``not_found``.
        """
        validate_key(key)
        check_presign_allowed(key)
        if self.stat(key) is None:
            raise NotFound("object", key)
        capped = min(ttl, timedelta(seconds=self._settings.presign_ttl_s))
        return str(self._presign_client.presigned_get_object(self._bucket, key, expires=capped))
