"""Budget endpoints (transport only)."""

from __future__ import annotations

from fastapi import APIRouter

from dpsynth_api.budgets import service
from dpsynth_api.budgets.schemas import BudgetOut, BudgetPatch
from dpsynth_api.deps import LedgerDep, OwnerDep, ReaderDep, SessionDep

router = APIRouter(prefix="/v1/datasets", tags=["budgets"])


@router.get("/{dataset_id}/budget", response_model=BudgetOut)
def get_budget(dataset_id: str, session: SessionDep, principal: ReaderDep,
               ledger: LedgerDep) -> BudgetOut:
    """The ledger's budget view of a private dataset, with ``warning`` at its
    ``warning_fraction`` (default 80%) of the limit."""
    return service.get_budget(session, principal=principal, ledger=ledger, dataset_id=dataset_id)


@router.patch("/{dataset_id}/budget", response_model=BudgetOut)
def update_budget(dataset_id: str, body: BudgetPatch, session: SessionDep, principal: OwnerDep,
                  ledger: LedgerDep) -> BudgetOut:
    """Lower the epsilon limit (never raised: 422 ``policy_violation``) and/or set the
    warning fraction. A limit below what is spent is allowed: it only blocks new work."""
    return service.update_budget(session, principal=principal, ledger=ledger,
                                 dataset_id=dataset_id, body=body)
