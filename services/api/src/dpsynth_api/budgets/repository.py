"""Budget queries: which of a tenant's datasets charge one ledger budget."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from dpsynth_api.tables import Dataset


def datasets_sharing(session: Session, *, tenant_id: str, budget_id: str) -> list[Dataset]:
    """The tenant's datasets that charge ``budget_id``: its owner (the upload whose id the
    budget bears) first, then the derived and linked ones, oldest first; deleted ones too
    (their charges stay on the budget)."""
    rows = session.execute(select(Dataset).where(
        Dataset.tenant_id == tenant_id,
        or_(Dataset.budget_id == budget_id, Dataset.id == budget_id),
    ).order_by(Dataset.created_at, Dataset.id)).scalars().all()
    return sorted(rows, key=lambda row: row.id != budget_id)
