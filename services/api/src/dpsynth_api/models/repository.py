"""SQL for models (flush only)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api import pagination
from dpsynth_api.tables import Model


def add(session: Session, model: Model) -> Model:
    session.add(model)
    session.flush()
    return model


def get_for_tenant(session: Session, *, tenant_id: str, model_id: str) -> Model | None:
    model = session.get(Model, model_id)
    return model if model is not None and model.tenant_id == tenant_id else None


def list_for_tenant(session: Session, *, tenant_id: str, limit: int,
                    cursor: str | None) -> list[Model]:
    stmt = pagination.page(select(Model).where(Model.tenant_id == tenant_id), Model,
                           limit=limit, cursor=cursor)
    return list(session.scalars(stmt))
