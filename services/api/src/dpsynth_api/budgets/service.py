"""Budget views (proxied from the ledger, the single source of truth for epsilon)."""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import BudgetView, LimitUpdate
from sqlalchemy.orm import Session

from dpsynth_api.budgets.repository import datasets_sharing
from dpsynth_api.budgets.schemas import BudgetOut, BudgetPatch
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.policies import budget_id_of
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Dataset
from dpsynth_api.tenants.security import Principal

BUDGET_WARNING_FRACTION = 0.8


def _private(session: Session, principal: Principal, dataset_id: str) -> Dataset:
    dataset = get_dataset(session, principal=principal, dataset_id=dataset_id)
    if dataset.visibility != "private":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH,
                           "a public dataset has no privacy budget")
    return dataset


def budget_out(view: BudgetView, *, budget_id: str | None = None,
               budget_dataset_ids: list[str] | None = None) -> BudgetOut:
    """The ledger's view with ``warning`` at the dataset's fraction (default 80%), the
    budget's owner and the datasets that share it (the ledger keys a budget by its owner's
    id, so ``budget_id`` defaults to the view's ``dataset_id``)."""
    fraction = view.warning_fraction or BUDGET_WARNING_FRACTION
    warning = view.dataset_epsilon_spent >= fraction * view.epsilon_limit
    return BudgetOut(**{**view.model_dump(), "warning": warning,
                        "budget_id": budget_id or view.dataset_id,
                        "budget_dataset_ids": budget_dataset_ids or []})


def _shared_out(session: Session, principal: Principal, budget_id: str,
                view: BudgetView) -> BudgetOut:
    rows = datasets_sharing(session, tenant_id=principal.tenant_id, budget_id=budget_id)
    return budget_out(view, budget_id=budget_id,
                      budget_dataset_ids=[row.id for row in rows])


def get_budget(session: Session, *, principal: Principal, ledger: LedgerPort,
               dataset_id: str) -> BudgetOut:
    """The ledger's view of the tenant's private dataset, with a warning at its fraction.

    Raises:
        DpsynthError: 404 for another tenant's dataset, 422 ``visibility_mismatch`` for a
            public one (it has no budget).
    """
    dataset = _private(session, principal, dataset_id)
    budget_id = budget_id_of(dataset)
    return _shared_out(session, principal, budget_id, ledger.get_budget(budget_id))


def update_budget(session: Session, *, principal: Principal, ledger: LedgerPort,
                  dataset_id: str, body: BudgetPatch) -> BudgetOut:
    """Lower the dataset's limit and/or set its warning fraction (at the ledger, under the
    budget's row lock), then mirror them on the api rows that share the budget.

    Raises:
        DpsynthError: 404 / 422 ``visibility_mismatch`` as :func:`get_budget`; 400
            ``invalid_request`` for an empty body; 422 ``policy_violation`` for a raise.
    """
    if body.epsilon_limit is None and body.warning_fraction is None:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "give epsilon_limit (lower only) and/or warning_fraction")
    dataset = _private(session, principal, dataset_id)
    budget_id = budget_id_of(dataset)
    view = ledger.update_limit(budget_id, LimitUpdate(epsilon_limit=body.epsilon_limit,
                                                      warning_fraction=body.warning_fraction))
    rows = datasets_sharing(session, tenant_id=principal.tenant_id, budget_id=budget_id)
    for row in rows:
        row.epsilon_limit = view.epsilon_limit
        row.warning_fraction = view.warning_fraction
    session.commit()
    return budget_out(view, budget_id=budget_id, budget_dataset_ids=[row.id for row in rows])
