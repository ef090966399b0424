"""Deleting a dataset: its stored data goes; its row, budget, ledger and record hashes stay
(docs/privacy.md, "Records, overlap and derived data")."""

from __future__ import annotations

import logging

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.job_states import JobState, is_terminal
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.datasets import derive
from dpsynth_api.datasets import repository as repo
from dpsynth_api.db import utcnow
from dpsynth_api.ports import ObjectStore
from dpsynth_api.tables import Dataset, Job
from dpsynth_api.tenants.security import Principal

log = logging.getLogger(__name__)

_LIVE_JOB_STATES = tuple(str(s) for s in JobState if not is_terminal(s))


def _sharing_descendants(session: Session, dataset: Dataset) -> list[Dataset]:
    """The derived datasets (subsets, splits, recursively) that read ``dataset``'s object."""
    found: list[Dataset] = []
    frontier = [dataset.id]
    while frontier:
        rows = list(session.scalars(select(Dataset).where(
            Dataset.parent_id.in_(frontier), Dataset.tenant_id == dataset.tenant_id)))
        rows = [r for r in rows if (r.derivation or {}).get("kind") in derive.SELECTING_KINDS]
        found += rows
        frontier = [r.id for r in rows]
    return found


def delete_dataset(session: Session, *, principal: Principal, store: ObjectStore,
                   dataset_id: str) -> Dataset:
    """Delete a dataset's stored data; keep its row, budget, ledger and record hashes.

    The derived datasets that select from its object lose their data with it and are marked
    deleted too. A linked or derived dataset deletes only what it stored itself (its own
    object, or its split's indices), never its parent's data. Idempotent.

    Raises:
        DpsynthError: 404 for another tenant's id; 409 ``conflict`` while a job on the
            dataset (or on a dataset reading its data) is not finished.
    """
    dataset = repo.lock_for_tenant(session, tenant_id=principal.tenant_id,
                                   dataset_id=dataset_id)
    if dataset is None:
        raise NotFound("dataset", dataset_id)
    if dataset.deleted_at is not None:
        session.rollback()
        return dataset
    family = [dataset, *_sharing_descendants(session, dataset)]
    live = list(session.scalars(select(Job.id).where(
        Job.dataset_id.in_([d.id for d in family]), Job.state.in_(_LIVE_JOB_STATES))))
    if live:
        session.rollback()
        raise DpsynthError(ErrorCode.CONFLICT, f"{len(live)} job(s) on this dataset or on "
                           "datasets derived from it are queued or running; cancel them or "
                           "wait for them to finish before deleting the data",
                           job_ids=sorted(live))
    now = utcnow()
    keys: list[str] = []
    for row in family:
        if row.deleted_at is None:
            row.deleted_at = now
        selection = derive.selection_of(row)
        if selection is not None:
            if selection.get("indices_key"):
                keys.append(str(selection["indices_key"]))
        elif row is dataset:
            keys.append(row.object_key)
            if row.holdout_object_key:
                keys.append(row.holdout_object_key)
    session.flush()
    for key in keys:  # the data goes first: a failure leaves it undeleted, never half-hidden
        store.delete(key)
    session.commit()
    log.info("dataset deleted", extra={"dataset_id": dataset.id,
                                       "derived_deleted": len(family) - 1})
    return dataset
