"""Ledger history endpoints of a private dataset (transport only)."""

from __future__ import annotations

from typing import Literal

from dpsynth_shared.ledger_contract import RecomputeReport, VerifyReport
from fastapi import APIRouter, Request
from fastapi.responses import Response

from dpsynth_api.deps import LedgerDep, ReaderDep, SessionDep
from dpsynth_api.ledger_views import service
from dpsynth_api.ledger_views.service import LedgerExport

router = APIRouter(prefix="/v1/datasets", tags=["ledger"])


@router.get("/{dataset_id}/ledger", response_model=LedgerExport,
            responses={200: {"content": {"text/csv": {}}}})
def export_ledger(dataset_id: str, request: Request, session: SessionDep, principal: ReaderDep,
                  ledger: LedgerDep, format: Literal["json", "csv"] | None = None
                  ) -> LedgerExport | Response:
    """The dataset's hash-chained ledger entries (JSON with the chain key; ``?format=csv``
    or ``Accept: text/csv`` for one CSV row per entry)."""
    body = service.export(session, principal=principal, ledger=ledger, dataset_id=dataset_id)
    accept = request.headers.get("accept", "")
    if format == "csv" or (format is None and "text/csv" in accept):
        return Response(service.to_csv(body), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{dataset_id}-ledger.csv"'})
    return body


@router.get("/{dataset_id}/ledger/verify", response_model=VerifyReport)
def verify_ledger(dataset_id: str, session: SessionDep, principal: ReaderDep,
                  ledger: LedgerDep) -> VerifyReport:
    """The ledger's verification filtered to this dataset: hashes, links, signatures, the
    anchor, every charge, and every epsilon of the dataset recomputed."""
    return service.verify(session, principal=principal, ledger=ledger, dataset_id=dataset_id)


@router.get("/{dataset_id}/ledger/recompute", response_model=RecomputeReport)
def recompute_ledger(dataset_id: str, session: SessionDep, principal: ReaderDep,
                     ledger: LedgerDep) -> RecomputeReport:
    """Every charge and the filter/tight figures recomputed with the current accountant code
    next to the recorded ones; never changes a stored figure or re-admits anything."""
    return service.recompute(session, principal=principal, ledger=ledger,
                             dataset_id=dataset_id)
