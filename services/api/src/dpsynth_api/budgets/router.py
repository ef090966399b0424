"""Budget endpoints (transport only)."""

from __future__ import annotations

from fastapi import APIRouter

from dpsynth_api.budgets import service
from dpsynth_api.budgets.schemas import BudgetOut
from dpsynth_api.deps import LedgerDep, ReaderDep, SessionDep

router = APIRouter(prefix="/v1/datasets", tags=["budgets"])


@router.get("/{dataset_id}/budget", response_model=BudgetOut)
def get_budget(dataset_id: str, session: SessionDep, principal: ReaderDep,
               ledger: LedgerDep) -> BudgetOut:
    """The ledger's budget view of a private dataset, with ``warning`` at 80% spent."""
    return service.get_budget(session, principal=principal, ledger=ledger, dataset_id=dataset_id)
