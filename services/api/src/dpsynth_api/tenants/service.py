"""Use cases of tenants and keys: create, add key, revoke, authenticate, bootstrap."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import new_tenant_id
from sqlalchemy.orm import Session

from dpsynth_api.db import utcnow
from dpsynth_api.tables import ApiKey, Tenant
from dpsynth_api.tenants import repository as repo
from dpsynth_api.tenants.schemas import CreatedKey, CreatedTenant
from dpsynth_api.tenants.security import (
    ALL_SCOPES,
    Principal,
    Scope,
    generate_key,
    hash_secret,
    parse_token,
    secret_matches,
)

log = logging.getLogger(__name__)


def _key_out(key: ApiKey, token: str) -> CreatedKey:
    return CreatedKey(key_id=key.id, tenant_id=key.tenant_id, scopes=key.scopes, name=key.name,
                      created_at=key.created_at, revoked_at=key.revoked_at, api_key=token)


def _new_tenant(session: Session, *, name: str, scopes: list[Scope],
                is_admin: bool) -> tuple[Tenant, CreatedKey]:
    tenant = repo.add_tenant(session, tenant_id=new_tenant_id(), name=name, is_admin=is_admin)
    new = generate_key()
    key = repo.add_key(session, key_id=new.key_id, tenant_id=tenant.id,
                       secret_sha256=hash_secret(new.secret),
                       scopes=sorted({str(s) for s in scopes}), name="first key")
    return tenant, _key_out(key, new.token)


def create_tenant(session: Session, *, name: str, scopes: list[Scope]) -> CreatedTenant:
    """Create a tenant and its first key (returned once, with the secret)."""
    tenant, key = _new_tenant(session, name=name, scopes=scopes, is_admin=False)
    session.commit()
    return CreatedTenant(tenant_id=tenant.id, name=tenant.name, created_at=tenant.created_at,
                         key=key)


def create_key(session: Session, *, tenant_id: str, scopes: list[Scope],
               name: str | None) -> CreatedKey:
    """Add a key with ``scopes`` to an existing tenant."""
    if repo.get_tenant(session, tenant_id) is None:
        raise NotFound("tenant", tenant_id)
    new = generate_key()
    key = repo.add_key(session, key_id=new.key_id, tenant_id=tenant_id,
                       secret_sha256=hash_secret(new.secret),
                       scopes=sorted({str(s) for s in scopes}), name=name)
    session.commit()
    return _key_out(key, new.token)


def revoke_key(session: Session, *, key_id: str) -> ApiKey:
    """Revoke a key (idempotent); a revoked key answers 401 from then on."""
    key = repo.get_key(session, key_id)
    if key is None:
        raise NotFound("key", key_id)
    repo.revoke_key(session, key, at=utcnow())
    session.commit()
    return key


def authenticate(session: Session, *, token: str) -> Principal:
    """The principal of a bearer token, or 401 ``unauthenticated`` (one message for all
    failures, so a caller cannot tell an unknown key from a revoked one)."""
    failure = DpsynthError(ErrorCode.UNAUTHENTICATED, "a valid API key is required "
                           "(Authorization: Bearer dps_...)")
    parsed = parse_token(token)
    if parsed is None:
        raise failure
    key = repo.get_key(session, parsed[0])
    if key is None or key.revoked_at is not None or not secret_matches(parsed[1],
                                                                       key.secret_sha256):
        raise failure
    return Principal(tenant_id=key.tenant_id, key_id=key.id,
                     scopes=frozenset(Scope(s) for s in key.scopes))


def bootstrap_admin(session: Session, *, credentials_file: Path, api_url: str) -> bool:
    """Create tenant ``admin`` with an all-scopes key and write it to ``credentials_file``
    (mode 0600) when no admin tenant exists yet and the file does not exist.

    Idempotent across restarts: an existing admin tenant or file is never touched.

    Returns:
        True when a tenant was created.
    """
    if credentials_file.exists() or repo.find_admin_tenant(session) is not None:
        return False
    tenant, key = _new_tenant(session, name="admin", scopes=sorted(ALL_SCOPES), is_admin=True)
    payload = {"api_url": api_url, "tenant_id": tenant.id, "api_key": key.api_key}
    credentials_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(credentials_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2)
    os.chmod(credentials_file, 0o600)
    try:
        session.commit()
    except Exception:
        credentials_file.unlink(missing_ok=True)  # never leave a key that does not exist
        raise
    log.info("bootstrapped the admin tenant", extra={"tenant_id": tenant.id,
                                                      "credentials_file": str(credentials_file)})
    return True
