"""The embedded platform's secrets: generated once, kept in ``<home>/secrets.json`` (0600).

They must survive ``down``/``up``: the grant signing key signs grants the ledger has
recorded, the chain signing key signs every ledger entry and anchor record (verification
checks old entries with it), the record hash key keys the api's stored subject hashes (a new
key would stop later uploads from matching the subjects already stored), and the service
tokens are what the processes present to one another. The Redis password is Redis's
``requirepass``: every broker URL carries it. The metrics token is what a scrape of the api's
and the ledger's ``/metrics`` must present (issue 14, item 11), kept apart from every API key
and service token so that what a Prometheus holds can call no API.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from dpsynth_shared.grants import generate_signing_key, public_key_of

SECRETS_FILE = "secrets.json"


@dataclass(frozen=True)
class PlatformSecrets:
    """Tokens and keys the embedded services present to each other."""

    ledger_token_api: str
    ledger_token_worker: str
    api_worker_token: str
    grant_signing_key: str
    grant_public_key: str
    chain_signing_key: str
    record_hash_key: str
    redis_password: str
    metrics_token: str

    @classmethod
    def generate(cls) -> PlatformSecrets:
        """Fresh random secrets (256-bit tokens, a new Ed25519 key)."""
        signing = generate_signing_key()
        return cls(
            ledger_token_api=secrets.token_urlsafe(32),
            ledger_token_worker=secrets.token_urlsafe(32),
            api_worker_token=secrets.token_urlsafe(32),
            grant_signing_key=signing,
            grant_public_key=public_key_of(signing),
            chain_signing_key=generate_signing_key(),
            record_hash_key=_new_token(),
            redis_password=_new_token(),
            metrics_token=_new_token(),
        )


def _new_token() -> str:
    return secrets.token_urlsafe(32)


_ADDED_LATER: dict[str, Callable[[], str]] = {
    "chain_signing_key": generate_signing_key,
    "record_hash_key": _new_token,
    "redis_password": _new_token,
    "metrics_token": _new_token,
}
"""Secrets newer than the first secrets files, and how to make each."""


def load_or_create_secrets(home: Path) -> PlatformSecrets:
    """Read ``<home>/secrets.json``, creating it (mode 0600, exclusively) on first use.

    An existing file keeps its secrets; its mode is tightened to 0600 if it drifted. A file
    written before the chain key, the record hash key, the Redis password or the metrics
    token existed gets the missing ones added, once (under an exclusive lock, by an atomic
    replace that keeps every other secret).
    """
    path = Path(home) / SECRETS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fresh = PlatformSecrets.generate()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # a concurrent `up` won the race: use its secrets
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                json.dump(asdict(fresh), handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
    os.chmod(path, 0o600)
    values = json.loads(path.read_text())
    if any(name not in values for name in _ADDED_LATER):
        values = _add_missing_secrets(path)
    return PlatformSecrets(**values)


def _add_missing_secrets(path: Path) -> dict[str, str]:
    """Add the secrets an older file lacks (those of :data:`_ADDED_LATER`), atomically and
    only once."""
    with open(path, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent `up` waits, then sees the keys
        values: dict[str, str] = json.loads(path.read_text())
        missing = [name for name in _ADDED_LATER if name not in values]
        if not missing:
            return values
        for name in missing:
            values[name] = _ADDED_LATER[name]()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(values, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return values
