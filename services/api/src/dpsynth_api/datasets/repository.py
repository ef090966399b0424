"""SQL for datasets (flush only)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api import pagination
from dpsynth_api.tables import Dataset


def add(session: Session, dataset: Dataset) -> Dataset:
    session.add(dataset)
    session.flush()
    return dataset


def get_for_tenant(session: Session, *, tenant_id: str, dataset_id: str) -> Dataset | None:
    """The tenant's dataset, or None (other tenants' datasets do not exist for it)."""
    dataset = session.get(Dataset, dataset_id)
    return dataset if dataset is not None and dataset.tenant_id == tenant_id else None


def list_for_tenant(session: Session, *, tenant_id: str, limit: int,
                    cursor: str | None) -> list[Dataset]:
    stmt = pagination.page(select(Dataset).where(Dataset.tenant_id == tenant_id), Dataset,
                           limit=limit, cursor=cursor)
    return list(session.scalars(stmt))


def lock_for_tenant(session: Session, *, tenant_id: str, dataset_id: str) -> Dataset | None:
    """The tenant's dataset row under ``SELECT … FOR UPDATE`` (serialises class-size
    releases of one dataset), or None."""
    stmt = select(Dataset).where(Dataset.id == dataset_id,
                                 Dataset.tenant_id == tenant_id).with_for_update()
    return session.execute(stmt).scalar_one_or_none()
