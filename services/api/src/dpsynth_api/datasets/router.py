"""Dataset endpoints (transport only)."""

from __future__ import annotations

from typing import Annotated

from dpsynth_shared.upload_formats import accepted_sentence
from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.concurrency import run_in_threadpool

from dpsynth_api.datasets import class_sizes, deletion, derive, holdout, service
from dpsynth_api.datasets.schemas import (
    ClassSizesReleaseIn,
    ClassSizesReleaseOut,
    DatasetOut,
    DatasetPage,
    DeriveIn,
    HeldOutRecord,
    HoldoutOut,
    dataset_out,
    dataset_summary,
)
from dpsynth_api.deps import ContextDep, OwnerDep, ReaderDep, SessionDep, SubmitterDep
from dpsynth_api.pagination import split
from dpsynth_api.tenants.security import Scope

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetOut)
async def upload_dataset(
    ctx: ContextDep, session: SessionDep, principal: SubmitterDep,
    file: Annotated[UploadFile, File(description="the dataset file; " + accepted_sentence()
                                     + " (docs/datasets.md)")],
    metadata: Annotated[str, Form(description="JSON: name, visibility, epsilon_limit, delta, "
                                  "label_domain, declared_size, neighbouring, on_overlap, "
                                  "holdout_fraction or holdout_from, label_column, ...")],
) -> DatasetOut:
    """Upload a dataset; a private one registers its budget with the ledger. A file of no
    accepted format is refused (422 ``invalid_archive``) with the list of accepted ones."""
    try:
        dataset = await run_in_threadpool(
            service.upload_dataset, session, principal=principal, store=ctx.store,
            ledger=ctx.ledger, settings=ctx.settings, metadata=metadata,
            filename=file.filename, upload=file.file)
    except Exception:
        ctx.metrics.uploads.labels(kind="dataset", outcome="refused").inc()
        raise
    ctx.metrics.uploads.labels(kind="dataset", outcome="accepted").inc()
    return dataset_out(dataset, owner=principal.has(Scope.OWNER))


@router.get("", response_model=DatasetPage)
def list_datasets(session: SessionDep, principal: ReaderDep,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50,
                  cursor: str | None = None) -> DatasetPage:
    """The tenant's datasets, newest first, without per-class detail (class names, counts
    and sizes: ``GET /v1/datasets/{dataset_id}`` has them)."""
    rows, next_cursor = split(service.list_datasets(session, principal=principal, limit=limit,
                                                    cursor=cursor), limit)
    owner = principal.has(Scope.OWNER)
    return DatasetPage(items=[dataset_summary(d, owner=owner) for d in rows],
                       next_cursor=next_cursor)


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: str, session: SessionDep, principal: ReaderDep) -> DatasetOut:
    """One dataset (the true count and per-class counts only with the owner scope)."""
    dataset = service.get_dataset(session, principal=principal, dataset_id=dataset_id)
    return dataset_out(dataset, owner=principal.has(Scope.OWNER))


@router.get("/{dataset_id}/holdout", response_model=HoldoutOut)
def list_held_out(dataset_id: str, session: SessionDep, principal: OwnerDep) -> HoldoutOut:
    """The upload's held-out records (owner scope): each one's position in the upload and
    its unkeyed content hash, so an evaluation can be reproduced outside the platform."""
    rows = holdout.list_held_out(session, principal=principal, dataset_id=dataset_id)
    return HoldoutOut(items=[HeldOutRecord(index=i, record_hash=h) for i, h in rows])


@router.post("/{dataset_id}/class-sizes/release", response_model=ClassSizesReleaseOut)
def release_class_sizes(dataset_id: str, body: ClassSizesReleaseIn, ctx: ContextDep,
                        session: SessionDep, principal: SubmitterDep) -> ClassSizesReleaseOut:
    """Release the dataset's public class sizes through a Gaussian histogram charged to its
    budget (per-label training); ``dry_run`` shows sigma and the budget impact only."""
    return class_sizes.release_class_sizes(session, principal=principal, ledger=ctx.ledger,
                                       dataset_id=dataset_id, body=body)


@router.post("/{dataset_id}/derive", status_code=201, response_model=DatasetOut)
def derive_dataset(dataset_id: str, body: DeriveIn, session: SessionDep,
                   principal: SubmitterDep) -> DatasetOut:
    """A class subset or a keyed-hash split of the dataset: a selection over its records
    (no copy); a private one charges the parent's budget with its own public size N̂."""
    dataset = derive.derive_dataset(session, principal=principal, dataset_id=dataset_id,
                                    body=body)
    return dataset_out(dataset, owner=principal.has(Scope.OWNER))


@router.delete("/{dataset_id}", response_model=DatasetOut)
def delete_dataset(dataset_id: str, ctx: ContextDep, session: SessionDep,
                   principal: OwnerDep) -> DatasetOut:
    """Delete the dataset's stored data (409 while a job on it runs). The row, its budget,
    its ledger entries and its record hashes remain: a re-upload of its records is still
    refused or linked to the same, still-charged budget."""
    dataset = deletion.delete_dataset(session, principal=principal, store=ctx.store,
                                     dataset_id=dataset_id)
    return dataset_out(dataset, owner=True)
