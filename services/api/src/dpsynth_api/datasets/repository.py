"""SQL for datasets (flush only)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api import pagination
from dpsynth_api.tables import Dataset, RecordHash


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


def training_records(session: Session, *, dataset_id: str) -> list[tuple[str, int]] | None:
    """(content hash, class index) of each image the upload trains on (not held out), in
    upload order; None when the upload predates their positions (migration 0008)."""
    stmt = (select(RecordHash.record_hash, RecordHash.label, RecordHash.held_out)
            .where(RecordHash.dataset_id == dataset_id, RecordHash.position.is_not(None))
            .order_by(RecordHash.position))
    found: list[tuple[str, int]] = []
    rows = session.execute(stmt).all()
    for record_hash, label, held_out in rows:
        if label is None or held_out is None:
            return None
        if not held_out:
            found.append((record_hash, label))
    return found if rows else None


def held_out_records(session: Session, *, dataset_id: str) -> list[tuple[int, str]]:
    """(position in the upload, content hash) of each held-out image, in upload order."""
    stmt = (select(RecordHash.position, RecordHash.record_hash)
            .where(RecordHash.dataset_id == dataset_id, RecordHash.position.is_not(None),
                   RecordHash.held_out.is_(True))
            .order_by(RecordHash.position))
    return [(p, h) for p, h in session.execute(stmt).all() if p is not None]
