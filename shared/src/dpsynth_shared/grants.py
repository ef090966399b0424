"""Read grants: Ed25519-signed tokens that let one job attempt read one private dataset.

The ledger signs a grant when it moves a reservation to "touched" and renews it with each
step lease; the object store adapters verify it (with the ledger's *public* key only) before
serving an object under a private prefix. A grant names the dataset prefix it opens and
expires with the lease, so a zombie attempt whose lease lapsed is refused by the store too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from dpsynth_shared.errors import DpsynthError, ErrorCode


@dataclass(frozen=True)
class GrantClaims:
    grant_id: str
    dataset_id: str
    reservation_id: str
    job_id: str
    attempt: int
    expires_at: float  # unix seconds

    @property
    def prefix(self) -> str:
        return private_dataset_prefix(self.dataset_id)


def private_dataset_prefix(dataset_id: str) -> str:
    """Object-key prefix of a private dataset's objects (readable only with a grant)."""
    return f"private/datasets/{dataset_id}/"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate_signing_key() -> str:
    """A new Ed25519 private key, as unpadded url-safe base64 of its 32 raw bytes."""
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return _b64(raw)


def public_key_of(private_key_b64: str) -> str:
    key = Ed25519PrivateKey.from_private_bytes(_unb64(private_key_b64))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _b64(raw)


def check_public_key(public_key_b64: str) -> str:
    """``public_key_b64`` itself if it is an Ed25519 public key (urlsafe base64 of 32 bytes).

    Raises:
        ValueError: otherwise.
    """
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public_key_b64))
    except (ValueError, TypeError) as exc:
        raise ValueError("not an Ed25519 public key (urlsafe base64 of 32 bytes)") from exc
    return public_key_b64


def check_public_keys(keys: list[str], setting: str) -> list[str]:
    """``keys`` itself if every one is an Ed25519 public key (a retired-keys setting).

    Raises:
        ValueError: naming ``setting``, otherwise.
    """
    try:
        return [check_public_key(k) for k in keys]
    except ValueError as exc:
        raise ValueError(f"{setting} must list Ed25519 public keys (urlsafe base64)") from exc


def public_keys_of(keys: str | Sequence[str] | None) -> list[str]:
    """The verification keys ``keys`` names: one key, or several (a key rollover), in order,
    without empty strings and duplicates."""
    if keys is None:
        return []
    listed = [keys] if isinstance(keys, str) else list(keys)
    return [k for k in dict.fromkeys(listed) if k]


def sign_grant(claims: GrantClaims, private_key_b64: str) -> str:
    """Serialise and sign ``claims``; the token is ``<payload>.<signature>``."""
    payload = json.dumps(claims.__dict__, sort_keys=True, separators=(",", ":")).encode()
    key = Ed25519PrivateKey.from_private_bytes(_unb64(private_key_b64))
    return f"{_b64(payload)}.{_b64(key.sign(payload))}"


def verify_grant(token: str, public_key_b64: str | Sequence[str], *,
                 now: float | None = None) -> GrantClaims:
    """Check a grant's signature and expiry and return its claims.

    ``public_key_b64`` is the ledger's grant public key, or several during a grant-key
    rollover (the current and the previous key): a signature by any of them is accepted.

    Raises:
        DpsynthError: ``invalid_grant`` when the token is malformed, forged or expired.
    """
    try:
        payload_b64, sig_b64 = token.split(".", 1)
        payload = _unb64(payload_b64)
        if not any(verify_message(payload, sig_b64, k) for k in public_keys_of(public_key_b64)):
            raise InvalidSignature
        claims = GrantClaims(**json.loads(payload))
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise DpsynthError(ErrorCode.INVALID_GRANT, "read grant is malformed or forged") from exc
    if (now if now is not None else time.time()) >= claims.expires_at:
        raise DpsynthError(ErrorCode.INVALID_GRANT, "read grant has expired (lease lapsed)")
    return claims


def key_id_of(public_key_b64: str) -> str:
    """A short, stable name of a public key: the first 16 hex digits of sha256(raw key)."""
    return hashlib.sha256(_unb64(public_key_b64)).hexdigest()[:16]


def sign_message(message: bytes, private_key_b64: str) -> str:
    """Ed25519 signature of ``message`` as unpadded url-safe base64 (chain heads, anchors)."""
    key = Ed25519PrivateKey.from_private_bytes(_unb64(private_key_b64))
    return _b64(key.sign(message))


def verify_message(message: bytes, signature_b64: str, public_key_b64: str) -> bool:
    """True iff ``signature_b64`` is the key's valid Ed25519 signature of ``message``."""
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public_key_b64)).verify(
            _unb64(signature_b64), message)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
