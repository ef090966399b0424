"""The embedded platform's secrets: generated once, kept in ``<home>/secrets.json`` (0600).

They must survive ``down``/``up``: the grant signing key signs grants the ledger has
recorded, and the service tokens are what the processes present to one another.
"""

from __future__ import annotations

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
        )


def load_or_create_secrets(home: Path) -> PlatformSecrets:
    """Read ``<home>/secrets.json``, creating it (mode 0600, exclusively) on first use.

    An existing file is never rewritten; its mode is tightened to 0600 if it drifted.
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
    return PlatformSecrets(**json.loads(path.read_text()))
