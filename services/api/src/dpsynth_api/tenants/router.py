"""Tenant and key endpoints (transport only).

Tenants and tenant policies are platform administration (the platform admin key); a tenant's
keys are administered by its owner keys, or by the platform admin (issue 14, item 6).
"""

from __future__ import annotations

from fastapi import APIRouter

from dpsynth_api import policies
from dpsynth_api.deps import AdminDep, KeyAdminDep, SessionDep
from dpsynth_api.policies import TenantPolicyIn, TenantPolicyOut
from dpsynth_api.tenants import service
from dpsynth_api.tenants.audit import audited
from dpsynth_api.tenants.schemas import CreatedKey, CreatedTenant, CreateKey, CreateTenant, KeyOut

router = APIRouter(prefix="/v1", tags=["tenants"])


@router.post("/tenants", status_code=201, response_model=CreatedTenant)
def create_tenant(body: CreateTenant, session: SessionDep, actor: AdminDep) -> CreatedTenant:
    """Create a tenant and its first key (the key is shown once; platform admin only; a
    platform scope is refused: 403 ``platform_scope_refused``)."""
    return service.create_tenant(session, name=body.name, scopes=body.scopes, actor=actor)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=CreatedKey)
def create_key(tenant_id: str, body: CreateKey, session: SessionDep,
               actor: KeyAdminDep) -> CreatedKey:
    """Add a key with the given scopes to a tenant (an owner key: its own tenant; the
    platform admin: any tenant)."""
    return service.create_key(session, actor=actor, tenant_id=tenant_id, scopes=body.scopes,
                              name=body.name)


@router.post("/keys/{key_id}/revoke", response_model=KeyOut)
def revoke_key(key_id: str, session: SessionDep, actor: KeyAdminDep) -> KeyOut:
    """Revoke a key (an owner key: its own tenant's; the platform admin: any)."""
    key = service.revoke_key(session, actor=actor, key_id=key_id)
    return KeyOut(key_id=key.id, tenant_id=key.tenant_id, scopes=key.scopes, name=key.name,
                  created_at=key.created_at, revoked_at=key.revoked_at)


@router.put("/admin/tenants/{tenant_id}/policy", response_model=TenantPolicyOut)
def set_tenant_policy(tenant_id: str, body: TenantPolicyIn, session: SessionDep,
                      actor: AdminDep) -> TenantPolicyOut:
    """Set (or clear, with null) the tenant's cap on any single dataset's epsilon limit;
    lists the tenant's existing datasets above the new cap (the cap binds new uploads)."""
    with audited(actor, "tenant.policy.set", target_tenant_id=tenant_id):
        return policies.set_tenant_policy(session, tenant_id=tenant_id, body=body)
