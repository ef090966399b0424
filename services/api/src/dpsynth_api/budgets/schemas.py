"""The budget view the api serves: the ledger's view plus a warning flag."""

from __future__ import annotations

from dpsynth_shared.ledger_contract import BudgetView
from pydantic import BaseModel, ConfigDict, Field


class BudgetOut(BudgetView):
    warning: bool = Field(description="dataset_epsilon_spent >= warning_fraction (default "
                          "80%) of epsilon_limit")
    budget_id: str = Field(description="the dataset whose budget this is (the budget's "
                           "owner): the dataset's own id for an upload, the upload it derives "
                           "from or is linked to otherwise. Datasets with the same budget_id "
                           "share every figure of this view")
    budget_dataset_ids: list[str] = Field(
        default_factory=list, description="every dataset of the tenant that charges this "
        "budget: the owner first, then the derived and linked ones, oldest first; deleted "
        "ones included (their charges stay)")


class BudgetPatch(BaseModel):
    """``PATCH /v1/datasets/{id}/budget``: lower the limit and/or set the warning fraction.

    A limit is set at upload and only ever lowered (a raise is 422 ``policy_violation``); a
    limit below the figure already spent is allowed and only blocks new work. The admission
    order stays the one chosen at upload; the RDP budget becomes the conversion of the new
    limit at that order.
    """

    model_config = ConfigDict(extra="forbid")

    epsilon_limit: float | None = Field(None, gt=0, le=100, description="the new, lower limit")
    warning_fraction: float | None = Field(None, gt=0, le=1, description="warn when spent "
                                           "reaches this fraction of the limit")
