"""Ports the api depends on (cosmicpython): adapters in :mod:`dpsynth_api.adapters`,
in-memory fakes in :mod:`dpsynth_api.fakes` for tests.

* :class:`ObjectStore`: :class:`dpsynth_shared.object_store.ObjectStore` (local dir or S3).
* :class:`LedgerPort`: the ledger's HTTP API (:mod:`dpsynth_shared.ledger_contract`).
* :class:`TaskSender`: sends ``dpsynth.run_job(job_id, attempt)`` to the worker queue.
"""

from __future__ import annotations

from typing import Literal, Protocol

from dpsynth_shared.ledger_contract import (
    AnchorStatus,
    BudgetView,
    ChainKey,
    CreateBudget,
    LedgerEntry,
    LimitUpdate,
    Plan,
    RecomputeReport,
    ReconcileReport,
    ReconcileRequest,
    Reservation,
    ReserveRequest,
    VerifyReport,
)
from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.release_contract import (
    Evaluation,
    EvaluationRequest,
    HistogramRelease,
    HistogramRequest,
    SetClassSizes,
    SizeReleasePlan,
    SizeReleasePlanRequest,
)

TASK_NAME = "dpsynth.run_job"
TASK_QUEUE = "dpsynth"


class LedgerPort(Protocol):
    """What the api asks the ledger. Errors come back as :class:`DpsynthError` with the
    ledger's code and numbers (e.g. 409 ``privacy_budget_exhausted``)."""

    def create_budget(self, request: CreateBudget) -> BudgetView: ...

    def get_budget(self, dataset_id: str) -> BudgetView: ...

    def plan(self, request: ReserveRequest) -> Plan:
        """A dry run of :meth:`reserve`: the calibrated plan, nothing stored."""
        ...

    def reserve(self, request: ReserveRequest) -> Reservation: ...

    def close_reservation(self, reservation_id: str,
                          outcome: Literal["succeeded", "failed", "cancelled"]) -> None: ...

    def plan_size_release(self, request: SizeReleasePlanRequest) -> SizeReleasePlan:
        """σ of a DP count of a dataset's size before its budget exists (charges nothing)."""
        ...

    def release_histogram(self, dataset_id: str,
                          request: HistogramRequest) -> HistogramRelease:
        """Admit and charge the class-size histogram (``dry_run``: only the plan)."""
        ...

    def set_class_sizes(self, dataset_id: str, request: SetClassSizes) -> BudgetView:
        """Set the budget's class sizes released by a charged histogram (a chained entry)."""
        ...

    def ready(self) -> bool:
        """True when the ledger can serve reads (also while it is behind its anchor: it then
        refuses writes only, and the api must stay up so an operator can reconcile)."""
        ...

    def behind_anchor(self) -> bool:
        """True when the ledger reports ``ledger_behind_anchor`` (restored from a backup)."""
        ...

    # -- export, verification and policies (issue 4) --------------------------------------
    def entries(self, dataset_id: str) -> list[LedgerEntry]:
        """The budget's hash-chained entries in seq order (every page)."""
        ...

    def chain_key(self) -> ChainKey | None:
        """The chain-signing key's public half (None: the ledger publishes none)."""
        ...

    def verify_budget(self, dataset_id: str) -> VerifyReport:
        """The chain verification filtered to the budget, with its epsilons recomputed."""
        ...

    def recompute(self, dataset_id: str) -> RecomputeReport:
        """Charges and figures recomputed with the current accountant code (a report)."""
        ...

    def update_limit(self, dataset_id: str, request: LimitUpdate) -> BudgetView:
        """Lower the limit (a raise is 422 ``policy_violation``) / set the warning fraction."""
        ...

    def reconcile(self, request: ReconcileRequest) -> ReconcileReport:
        """After a ledger restore: re-charge what its database lost (the api's DP jobs in
        ``request``) and re-base its anchor (``POST /v1/admin/reconcile``)."""
        ...

    def anchor_status(self) -> AnchorStatus:
        """The ledger's chain head against its anchored head (``GET /v1/anchor``)."""
        ...

    # -- non-DP evaluation reads (issue 5) -------------------------------------------------
    def authorise_evaluation(self, request: EvaluationRequest) -> Evaluation:
        """Authorise one non-DP evaluation read of a budget's data (``POST /v1/evaluations``):
        no epsilon is charged; the ledger records an ``evaluation_authorised`` entry."""
        ...

    def evaluations(self, dataset_id: str) -> list[Evaluation]:
        """The budget's evaluation authorisations (``GET /v1/datasets/{id}/evaluations``)."""
        ...


class TaskSender(Protocol):
    """Sends the worker task of one job attempt (after the job row is committed)."""

    def send_run_job(self, job_id: str, attempt: int) -> None: ...

    def ping(self) -> bool: ...


__all__ = ["TASK_NAME", "TASK_QUEUE", "LedgerPort", "ObjectStore", "TaskSender"]
