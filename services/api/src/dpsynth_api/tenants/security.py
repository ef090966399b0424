"""API keys: ``dps_<key id>_<secret>``, 256-bit random secrets stored as sha256.

A fast hash is enough because the secret is 256 bits of randomness (no dictionary to try);
comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from dpsynth_shared.ids import is_valid_id, new_id

KEY_PREFIX = "dps_"
QUERY_KEY_NAMES = frozenset({"api_key", "apikey", "key", "token", "access_token"})


class Scope(StrEnum):
    READ = "read"
    SUBMIT = "submit"
    OWNER = "owner"
    ADMIN = "admin"


ALL_SCOPES: frozenset[Scope] = frozenset(Scope)
# Platform scopes act across tenants (create tenants, mint or revoke any tenant's keys, set
# tenant policies, reconcile the ledger). Only keys of the platform's admin tenant
# (``tenants.is_admin``, created by ``bootstrap_admin``) may carry them: granting one to any
# other tenant is refused, and one found on such a key (an old row) is ignored at
# authentication (issue 14, item 6). Tenant scopes act within the key's own tenant.
PLATFORM_SCOPES: frozenset[Scope] = frozenset({Scope.ADMIN})
# owner ⊇ submit ⊇ read: an owner key can do what a submit key can, and more.
_IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.READ: frozenset({Scope.READ, Scope.SUBMIT, Scope.OWNER}),
    Scope.SUBMIT: frozenset({Scope.SUBMIT, Scope.OWNER}),
    Scope.OWNER: frozenset({Scope.OWNER}),
    Scope.ADMIN: frozenset({Scope.ADMIN}),
}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and the key (with its scopes)."""

    tenant_id: str
    key_id: str
    scopes: frozenset[Scope]

    def has(self, scope: Scope) -> bool:
        """True when one of the key's scopes grants ``scope``."""
        return bool(self.scopes & _IMPLIES[scope])

    @property
    def is_platform_admin(self) -> bool:
        """True for a key of the platform's admin tenant that carries a platform scope
        (``scopes`` holds the effective scopes: authentication drops platform scopes from
        keys of other tenants)."""
        return bool(self.scopes & PLATFORM_SCOPES)


@dataclass(frozen=True)
class NewKey:
    key_id: str
    secret: str

    @property
    def token(self) -> str:
        return f"{KEY_PREFIX}{self.key_id}_{self.secret}"


def generate_key() -> NewKey:
    """A new key id and a 256-bit secret (hex, so the token splits unambiguously)."""
    return NewKey(key_id=new_id("api_key"), secret=secrets.token_hex(32))


def hash_secret(secret: str) -> str:
    """sha256 hex of a key's secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a ``dps_...`` token, or None when it is malformed."""
    if not token.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = token[len(KEY_PREFIX):].rpartition("_")
    if not sep or not secret or not is_valid_id(key_id, "api_key"):
        return None
    return key_id, secret


def secret_matches(secret: str, stored_sha256: str) -> bool:
    """Constant-time comparison of a presented secret with the stored hash."""
    return hmac.compare_digest(hash_secret(secret), stored_sha256)


def looks_like_key_in_query(params: dict[str, str]) -> bool:
    """True when a query string carries a credential (refused: keys leak from URLs)."""
    return any(name.lower() in QUERY_KEY_NAMES or value.startswith(KEY_PREFIX)
               for name, value in params.items())
