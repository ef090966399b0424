"""Budget views (proxied from the ledger, the single source of truth for epsilon)."""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from sqlalchemy.orm import Session

from dpsynth_api.budgets.schemas import BudgetOut
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tenants.security import Principal

BUDGET_WARNING_FRACTION = 0.8


def get_budget(session: Session, *, principal: Principal, ledger: LedgerPort,
               dataset_id: str) -> BudgetOut:
    """The ledger's view of the tenant's private dataset, with a warning at 80% spent.

    Raises:
        DpsynthError: 404 for another tenant's dataset, 422 ``visibility_mismatch`` for a
            public one (it has no budget).
    """
    dataset = get_dataset(session, principal=principal, dataset_id=dataset_id)
    if dataset.visibility != "private":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH,
                           "a public dataset has no privacy budget")
    view = ledger.get_budget(dataset.id)
    fraction = view.warning_fraction or BUDGET_WARNING_FRACTION
    warning = view.dataset_epsilon_spent >= fraction * view.epsilon_limit
    return BudgetOut(**{**view.model_dump(), "warning": warning})
