"""Dataset endpoints (transport only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.concurrency import run_in_threadpool

from dpsynth_api.datasets import service
from dpsynth_api.datasets.schemas import (
    ClassSizesReleaseIn,
    ClassSizesReleaseOut,
    DatasetOut,
    DatasetPage,
    dataset_out,
)
from dpsynth_api.deps import ContextDep, ReaderDep, SessionDep, SubmitterDep
from dpsynth_api.pagination import split
from dpsynth_api.tenants.security import Scope

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetOut)
async def upload_dataset(
    ctx: ContextDep, session: SessionDep, principal: SubmitterDep,
    file: Annotated[UploadFile, File(description="zip / tar(.gz) image folder, or .npz")],
    metadata: Annotated[str, Form(description="JSON: name, visibility, epsilon_limit, delta, "
                                  "label_domain, declared_size, neighbouring")],
) -> DatasetOut:
    """Upload a dataset; a private one registers its budget with the ledger."""
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
    """The tenant's datasets, newest first."""
    rows, next_cursor = split(service.list_datasets(session, principal=principal, limit=limit,
                                                    cursor=cursor), limit)
    owner = principal.has(Scope.OWNER)
    return DatasetPage(items=[dataset_out(d, owner=owner) for d in rows], next_cursor=next_cursor)


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: str, session: SessionDep, principal: ReaderDep) -> DatasetOut:
    """One dataset (the true count and per-class counts only with the owner scope)."""
    dataset = service.get_dataset(session, principal=principal, dataset_id=dataset_id)
    return dataset_out(dataset, owner=principal.has(Scope.OWNER))


@router.post("/{dataset_id}/class-sizes/release", response_model=ClassSizesReleaseOut)
def release_class_sizes(dataset_id: str, body: ClassSizesReleaseIn, ctx: ContextDep,
                        session: SessionDep, principal: SubmitterDep) -> ClassSizesReleaseOut:
    """Release the dataset's public class sizes through a Gaussian histogram charged to its
    budget (per-label training); ``dry_run`` shows sigma and the budget impact only."""
    return service.release_class_sizes(session, principal=principal, ledger=ctx.ledger,
                                       dataset_id=dataset_id, body=body)
