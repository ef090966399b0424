"""The budget view the api serves: the ledger's view plus a warning flag."""

from __future__ import annotations

from dpsynth_shared.ledger_contract import BudgetView
from pydantic import Field


class BudgetOut(BudgetView):
    warning: bool = Field(description="dataset_epsilon_spent >= warning_fraction (default "
                          "80%) of epsilon_limit")
