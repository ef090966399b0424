"""Request and response bodies of the tenant and key endpoints."""

from __future__ import annotations

from datetime import datetime

from dpsynth_shared.text import Name
from pydantic import BaseModel, ConfigDict, Field

from dpsynth_api.tenants.security import Scope

DEFAULT_SCOPES = [Scope.READ, Scope.SUBMIT, Scope.OWNER]


class CreateTenant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=200)
    scopes: list[Scope] = Field(default_factory=lambda: list(DEFAULT_SCOPES),
                                description="scopes of the tenant's first key")


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[Scope] = Field(min_length=1)
    name: Name | None = Field(None, max_length=200)


class KeyOut(BaseModel):
    key_id: str
    tenant_id: str
    scopes: list[Scope]
    name: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None


class CreatedKey(KeyOut):
    api_key: str = Field(description="the secret key: shown once, never stored in clear")


class TenantOut(BaseModel):
    tenant_id: str
    name: str
    created_at: datetime


class CreatedTenant(TenantOut):
    key: CreatedKey
