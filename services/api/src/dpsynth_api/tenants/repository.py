"""SQL for tenants and keys (flush only; the use case commits)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.tables import ApiKey, Tenant


def add_tenant(session: Session, *, tenant_id: str, name: str, is_admin: bool) -> Tenant:
    tenant = Tenant(id=tenant_id, name=name, is_admin=is_admin)
    session.add(tenant)
    session.flush()
    return tenant


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def find_admin_tenant(session: Session) -> Tenant | None:
    return session.scalars(select(Tenant).where(Tenant.is_admin.is_(True)).limit(1)).first()


def add_key(session: Session, *, key_id: str, tenant_id: str, secret_sha256: str,
            scopes: list[str], name: str | None) -> ApiKey:
    key = ApiKey(id=key_id, tenant_id=tenant_id, secret_sha256=secret_sha256, scopes=scopes,
                 name=name)
    session.add(key)
    session.flush()
    return key


def get_key(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def revoke_key(session: Session, key: ApiKey, *, at: datetime) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = at
        session.flush()
    return key
