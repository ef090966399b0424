"""Budget policies at the api (issue 4, item 5).

* A per-tenant cap on any single private dataset's epsilon limit, set by an admin
  (``PUT /v1/admin/tenants/{tenant_id}/policy``): an upload with a larger limit is 422
  ``policy_violation`` (:func:`check_upload`). Setting a cap never changes existing budgets
  (a limit is only ever lowered by its owner); the answer lists the datasets above it.
* A dataset's limit is set at upload and only ever lowered (``PATCH
  /v1/datasets/{id}/budget``, :mod:`dpsynth_api.budgets.service`): the ledger enforces it.
"""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_api.tables import Dataset, Tenant
from dpsynth_api.tenants.security import Principal


class TenantPolicyIn(BaseModel):
    """``PUT /v1/admin/tenants/{tenant_id}/policy``."""

    model_config = ConfigDict(extra="forbid")

    max_dataset_epsilon_limit: float | None = Field(
        None, gt=0, le=100, description="no private dataset of the tenant may be uploaded "
        "with a larger epsilon limit; null removes the cap")


class DatasetAboveCap(BaseModel):
    dataset_id: str
    name: str
    epsilon_limit: float


class TenantPolicyOut(BaseModel):
    tenant_id: str
    max_dataset_epsilon_limit: float | None
    datasets_above_cap: list[DatasetAboveCap] = Field(
        default_factory=list, description="the tenant's existing private datasets whose "
        "limit exceeds the new cap: the cap binds new uploads only; their owners may lower "
        "these limits (PATCH /v1/datasets/{id}/budget)")


def check_upload(session: Session, principal: Principal, meta: DatasetMetadata) -> None:
    """Refuse a private upload whose limit exceeds the tenant's cap.

    Raises:
        DpsynthError: 422 ``policy_violation`` with the cap and the requested limit.
    """
    if meta.visibility != "private" or meta.epsilon_limit is None:
        return
    tenant = session.get(Tenant, principal.tenant_id)
    cap = tenant.max_dataset_epsilon_limit if tenant is not None else None
    if cap is not None and meta.epsilon_limit > cap:
        raise DpsynthError(
            ErrorCode.POLICY_VIOLATION, f"epsilon_limit {meta.epsilon_limit:g} exceeds your "
            f"tenant's cap of {cap:g} on any single dataset's limit",
            max_dataset_epsilon_limit=cap, epsilon_limit=meta.epsilon_limit)


def set_tenant_policy(session: Session, *, tenant_id: str,
                      body: TenantPolicyIn) -> TenantPolicyOut:
    """Set (or clear) a tenant's cap and list its datasets above it.

    Raises:
        DpsynthError: 404 for an unknown tenant.
    """
    tenant = session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        raise NotFound("tenant", tenant_id)
    tenant.max_dataset_epsilon_limit = body.max_dataset_epsilon_limit
    above: list[DatasetAboveCap] = []
    cap = body.max_dataset_epsilon_limit
    if cap is not None:
        rows = session.execute(
            select(Dataset).where(Dataset.tenant_id == tenant_id,
                                  Dataset.visibility == "private",
                                  Dataset.deleted_at.is_(None),
                                  Dataset.epsilon_limit > cap)
            .order_by(Dataset.created_at, Dataset.id)).scalars()
        above = [DatasetAboveCap(dataset_id=d.id, name=d.name,
                                 epsilon_limit=float(d.epsilon_limit or 0.0)) for d in rows]
    session.commit()
    return TenantPolicyOut(tenant_id=tenant_id, max_dataset_epsilon_limit=cap,
                           datasets_above_cap=above)


def budget_id_of(dataset: Dataset) -> str:
    """The ledger budget a private dataset charges (its own for an original upload)."""
    return dataset.budget_id or dataset.id
