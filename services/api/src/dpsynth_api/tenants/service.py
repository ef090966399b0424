"""Use cases of tenants and keys: create, add key, revoke, authenticate, bootstrap.

Platform administration (tenants, any tenant's keys) belongs to the platform's admin tenant
alone; a tenant's owner administers its own tenant's keys (issue 14, item 6). Every call by
an API caller leaves an audit line (:mod:`dpsynth_api.tenants.audit`).
"""

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
from dpsynth_api.tenants.audit import audited
from dpsynth_api.tenants.schemas import CreatedKey, CreatedTenant
from dpsynth_api.tenants.security import (
    ALL_SCOPES,
    PLATFORM_SCOPES,
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


def _refuse_platform_scopes(scopes: list[Scope], *, reason: str) -> None:
    if PLATFORM_SCOPES & set(scopes):
        raise DpsynthError(
            ErrorCode.PLATFORM_SCOPE_REFUSED, f"{reason}: platform scopes "
            f"({', '.join(sorted(PLATFORM_SCOPES))}) belong to the platform's admin tenant "
            "only", refused_scopes=sorted(str(s) for s in PLATFORM_SCOPES & set(scopes)))


def create_tenant(session: Session, *, name: str, scopes: list[Scope],
                  actor: Principal | None = None) -> CreatedTenant:
    """Create a tenant and its first key (returned once, with the secret).

    A tenant created by an API caller (``actor``, the platform admin) is an ordinary tenant:
    its key may carry tenant scopes only (403 ``platform_scope_refused`` otherwise), so no
    key can ever hand out platform power. Operator code on the database (no ``actor``, like
    :func:`bootstrap_admin`) asking for platform scopes creates a platform admin tenant
    (``is_admin``), the only kind of tenant whose keys those scopes act for.
    """
    if actor is None:
        tenant, key = _new_tenant(session, name=name, scopes=scopes,
                                  is_admin=bool(PLATFORM_SCOPES & set(scopes)))
        session.commit()
        return CreatedTenant(tenant_id=tenant.id, name=tenant.name,
                             created_at=tenant.created_at, key=key)
    with audited(actor, "tenant.create", scopes=",".join(sorted(scopes))) as entry:
        _refuse_platform_scopes(scopes, reason="a new tenant is not the platform's admin")
        tenant, key = _new_tenant(session, name=name, scopes=scopes, is_admin=False)
        session.commit()
        entry.target_tenant_id = tenant.id
        entry.details["key_id"] = key.key_id
    return CreatedTenant(tenant_id=tenant.id, name=tenant.name, created_at=tenant.created_at,
                         key=key)


def create_key(session: Session, *, actor: Principal, tenant_id: str, scopes: list[Scope],
               name: str | None) -> CreatedKey:
    """Add a key with ``scopes`` to a tenant.

    A tenant's owner adds keys to its own tenant only (another tenant's id answers 404, like
    a missing one); the platform admin adds keys to any tenant (audited). A platform scope is
    granted only by the platform admin and only to the platform's admin tenant.
    """
    with audited(actor, "key.create", target_tenant_id=tenant_id,
                 scopes=",".join(sorted(scopes))) as entry:
        tenant = repo.get_tenant(session, tenant_id)
        if tenant is None or (tenant.id != actor.tenant_id and not actor.is_platform_admin):
            raise NotFound("tenant", tenant_id)
        if not tenant.is_admin:
            _refuse_platform_scopes(scopes, reason=f"tenant {tenant_id} is not the platform's "
                                    "admin tenant")
        elif not actor.is_platform_admin:
            _refuse_platform_scopes(scopes, reason="only a platform admin key grants them")
        new = generate_key()
        key = repo.add_key(session, key_id=new.key_id, tenant_id=tenant_id,
                           secret_sha256=hash_secret(new.secret),
                           scopes=sorted({str(s) for s in scopes}), name=name)
        session.commit()
        entry.details["key_id"] = key.id
    return _key_out(key, new.token)


def revoke_key(session: Session, *, actor: Principal, key_id: str) -> ApiKey:
    """Revoke a key (idempotent); a revoked key answers 401 from then on.

    A tenant's owner revokes its own tenant's keys only (another tenant's key answers 404,
    like a missing one); the platform admin revokes any key (audited).
    """
    with audited(actor, "key.revoke", key_id=key_id) as entry:
        key = repo.get_key(session, key_id)
        entry.target_tenant_id = key.tenant_id if key is not None else None
        if key is None or (key.tenant_id != actor.tenant_id and not actor.is_platform_admin):
            raise NotFound("key", key_id)
        repo.revoke_key(session, key, at=utcnow())
        session.commit()
    return key


def authenticate(session: Session, *, token: str) -> Principal:
    """The principal of a bearer token, or 401 ``unauthenticated`` (one message for all
    failures, so a caller cannot tell an unknown key from a revoked one).

    The principal's scopes are the key's effective ones: a platform scope on a key of any
    tenant but the platform's admin tenant (a row written before issue 14, item 6) is
    dropped and logged, so it grants nothing.
    """
    failure = DpsynthError(ErrorCode.UNAUTHENTICATED, "a valid API key is required "
                           "(Authorization: Bearer dps_...)")
    parsed = parse_token(token)
    if parsed is None:
        raise failure
    key = repo.get_key(session, parsed[0])
    if key is None or key.revoked_at is not None or not secret_matches(parsed[1],
                                                                       key.secret_sha256):
        raise failure
    scopes = frozenset(Scope(s) for s in key.scopes)
    if scopes & PLATFORM_SCOPES:
        tenant = repo.get_tenant(session, key.tenant_id)
        if tenant is None or not tenant.is_admin:
            log.warning("ignored the platform scopes of a key of a tenant that is not the "
                        "platform's admin; revoke the key and mint one with tenant scopes",
                        extra={"key_id": key.id, "tenant_id": key.tenant_id})
            scopes -= PLATFORM_SCOPES
    return Principal(tenant_id=key.tenant_id, key_id=key.id, scopes=scopes)


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
