"""Model endpoints (transport only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from dpsynth_api.deps import ContextDep, ReaderDep, SessionDep, StoreDep, SubmitterDep
from dpsynth_api.models import service
from dpsynth_api.models.schemas import ModelOut, ModelPage, model_out
from dpsynth_api.openapi import BINARY
from dpsynth_api.pagination import split

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post("", status_code=201, response_model=ModelOut)
async def upload_model(
    ctx: ContextDep, session: SessionDep, principal: SubmitterDep,
    file: Annotated[UploadFile, File(description="zip / tar of a diffusers folder")],
    metadata: Annotated[str | None, Form(description='JSON: {"name": ...}')] = None,
) -> ModelOut:
    """Upload a diffusers-format model (safetensors only)."""
    try:
        model = await run_in_threadpool(service.upload_model, session, principal=principal,
                                        store=ctx.store, settings=ctx.settings,
                                        metadata=metadata, upload=file.file)
    except Exception:
        ctx.metrics.uploads.labels(kind="model", outcome="refused").inc()
        raise
    ctx.metrics.uploads.labels(kind="model", outcome="accepted").inc()
    return model_out(model)


@router.get("", response_model=ModelPage)
def list_models(session: SessionDep, principal: ReaderDep,
                limit: Annotated[int, Query(ge=1, le=200)] = 50,
                cursor: str | None = None) -> ModelPage:
    """The tenant's models, newest first."""
    rows, next_cursor = split(service.list_models(session, principal=principal, limit=limit,
                                                  cursor=cursor), limit)
    return ModelPage(items=service.model_views(session, rows), next_cursor=next_cursor)


@router.get("/{model_id}", response_model=ModelOut)
def get_model(model_id: str, session: SessionDep, principal: ReaderDep) -> ModelOut:
    """One model with its lineage (dataset, jobs, dp flag, job_epsilon, rng stamp) and, for
    a DP model, its producing finetune's latest privacy audit or 'not_audited'."""
    [view] = service.model_views(
        session, [service.get_model(session, principal=principal, model_id=model_id)])
    return view


@router.get("/{model_id}/download", response_model=None,
            responses={200: {"content": {"application/zip": {"schema": BINARY}},
                             "description": "the zip of the diffusers folder + "
                                            "dpsynth_model.json, as uploaded"}})
def download_model(model_id: str, session: SessionDep, principal: ReaderDep,
                   store: StoreDep) -> StreamingResponse:
    """Stream a model as a zip (the upload format); ``rng: test`` models are refused (409)."""
    chunks = service.open_download(session, principal=principal, store=store,
                                   model_id=model_id)
    return StreamingResponse(chunks, media_type="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{model_id}.zip"'})
