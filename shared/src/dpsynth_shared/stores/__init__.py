"""Object-store adapters: :class:`LocalDirStore` (a folder) and :class:`S3Store` (S3 API).

Pick one from settings with :func:`from_settings`; both implement
:class:`dpsynth_shared.object_store.ObjectStore` and pass the same contract tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.settings import ObjectStoreSettings
from dpsynth_shared.stores.keys import validate_key
from dpsynth_shared.stores.local import LocalDirStore


def from_settings(
    settings: ObjectStoreSettings, *, grant_public_key: str | Sequence[str] | None = None
) -> ObjectStore:
    """Build the store ``settings.kind`` names.

    Args:
        settings: the ``OBJECT_STORE__*`` block of a service's settings.
        grant_public_key: the ledger's public key (workers), or its current and previous
            keys during a grant-key rollover; ``None`` where the process never reads
            private objects.
    """
    if settings.kind == "s3":
        from dpsynth_shared.stores.s3 import S3Store  # minio imported only when used

        return S3Store(settings, grant_public_key=grant_public_key)
    return LocalDirStore(Path(settings.root), grant_public_key=grant_public_key)


__all__ = ["LocalDirStore", "from_settings", "validate_key"]
