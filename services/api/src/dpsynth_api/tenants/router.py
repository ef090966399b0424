"""Admin endpoints: tenants and keys (transport only)."""

from __future__ import annotations

from fastapi import APIRouter

from dpsynth_api import policies
from dpsynth_api.deps import AdminDep, SessionDep
from dpsynth_api.policies import TenantPolicyIn, TenantPolicyOut
from dpsynth_api.tenants import service
from dpsynth_api.tenants.schemas import CreatedKey, CreatedTenant, CreateKey, CreateTenant, KeyOut

router = APIRouter(prefix="/v1", tags=["tenants"])


@router.post("/tenants", status_code=201, response_model=CreatedTenant)
def create_tenant(body: CreateTenant, session: SessionDep, _: AdminDep) -> CreatedTenant:
    """Create a tenant and its first key (the key is shown once)."""
    return service.create_tenant(session, name=body.name, scopes=body.scopes)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=CreatedKey)
def create_key(tenant_id: str, body: CreateKey, session: SessionDep, _: AdminDep) -> CreatedKey:
    """Add a key with the given scopes to a tenant."""
    return service.create_key(session, tenant_id=tenant_id, scopes=body.scopes, name=body.name)


@router.post("/keys/{key_id}/revoke", response_model=KeyOut)
def revoke_key(key_id: str, session: SessionDep, _: AdminDep) -> KeyOut:
    """Revoke a key."""
    key = service.revoke_key(session, key_id=key_id)
    return KeyOut(key_id=key.id, tenant_id=key.tenant_id, scopes=key.scopes, name=key.name,
                  created_at=key.created_at, revoked_at=key.revoked_at)


@router.put("/admin/tenants/{tenant_id}/policy", response_model=TenantPolicyOut)
def set_tenant_policy(tenant_id: str, body: TenantPolicyIn, session: SessionDep,
                      _: AdminDep) -> TenantPolicyOut:
    """Set (or clear, with null) the tenant's cap on any single dataset's epsilon limit;
    lists the tenant's existing datasets above the new cap (the cap binds new uploads)."""
    return policies.set_tenant_policy(session, tenant_id=tenant_id, body=body)
