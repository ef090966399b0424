"""The embedded platform's secrets: generated once, kept in ``<home>/secrets.json`` (0600).

They must survive ``down``/``up``: the grant signing key signs grants the ledger has
recorded, the chain signing key signs every ledger entry and anchor record (verification
checks old entries with it), and the service tokens are what the processes present to one
another.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
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
        )


def load_or_create_secrets(home: Path) -> PlatformSecrets:
    """Read ``<home>/secrets.json``, creating it (mode 0600, exclusively) on first use.

    An existing file keeps its secrets; its mode is tightened to 0600 if it drifted. A file
    written before the chain key existed gets one added, once (under an exclusive lock, by
    an atomic replace that keeps every other secret).
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
    if "chain_signing_key" not in values:
        values = _add_chain_key(path)
    return PlatformSecrets(**values)


def _add_chain_key(path: Path) -> dict[str, str]:
    """Add a chain signing key to an older secrets file, atomically and only once."""
    with open(path, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent `up` waits, then sees the key
        values: dict[str, str] = json.loads(path.read_text())
        if "chain_signing_key" in values:
            return values
        values["chain_signing_key"] = generate_signing_key()
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
