"""The ledger over HTTP (httpx), turning its problem+json back into :class:`DpsynthError`."""

from __future__ import annotations

from typing import Any, Literal

import httpx
from dpsynth_shared.errors import DpsynthError, ErrorCode, error_from_problem
from dpsynth_shared.ledger_contract import (
    AnchorStatus,
    BudgetView,
    ChainKey,
    CloseRequest,
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
from dpsynth_shared.release_contract import (
    Evaluation,
    EvaluationRequest,
    HistogramRelease,
    HistogramRequest,
    SetClassSizes,
    SizeReleasePlan,
    SizeReleasePlanRequest,
)

#: Entries asked of the ledger per page when exporting a budget's history.
ENTRIES_PAGE = 1000

#: How often a reservation is sent when the ledger's answer is lost (idempotent on job_id).
RESERVE_ATTEMPTS = 3


class HttpLedger:
    """:class:`dpsynth_api.ports.LedgerPort` against services/ledger's ``/v1`` API.

    Args:
        url: the ledger's base URL.
        token: the service bearer token the ledger accepts from the api.
        timeout_s: per-request timeout.
        transport: an httpx transport (tests may pass an ASGI transport).
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 120.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s,
                                    headers={"Authorization": f"Bearer {token}"},
                                    transport=transport)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE,
                               f"the ledger could not be reached ({type(exc).__name__})") from exc
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = None
            if isinstance(problem, dict) and "code" in problem:
                raise error_from_problem(problem)
            raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE,
                               f"the ledger answered HTTP {response.status_code}")
        return response.json() if response.content else None

    def create_budget(self, request: CreateBudget) -> BudgetView:
        """``POST /v1/budgets``."""
        return BudgetView.model_validate(self._call("POST", "/v1/budgets",
                                                    request.model_dump(mode="json")))

    def get_budget(self, dataset_id: str) -> BudgetView:
        """``GET /v1/budgets/{dataset_id}``."""
        return BudgetView.model_validate(self._call("GET", f"/v1/budgets/{dataset_id}"))

    def plan(self, request: ReserveRequest) -> Plan:
        """``POST /v1/reservations`` with ``dry_run: true``: the plan, nothing reserved."""
        body = request.model_copy(update={"dry_run": True}).model_dump(mode="json")
        data = self._call("POST", "/v1/reservations", body)
        if isinstance(data, dict) and "reservation_id" in data:  # a Reservation with its plan
            reservation = Reservation.model_validate(data)
            if reservation.plan is None:
                raise DpsynthError(ErrorCode.INTERNAL, "the ledger's dry run carried no plan")
            return reservation.plan
        return Plan.model_validate(data)

    def reserve(self, request: ReserveRequest) -> Reservation:
        """``POST /v1/reservations``: admission through the privacy filter.

        The ledger reserves idempotently on ``job_id``, so a request whose answer was lost
        (a timeout under load) is sent again: the retry returns the reservation already made
        instead of leaving it orphaned, and never reserves twice.
        """
        body = request.model_dump(mode="json")
        for _ in range(RESERVE_ATTEMPTS - 1):
            try:
                return Reservation.model_validate(self._call("POST", "/v1/reservations", body))
            except DpsynthError as err:
                if err.code != ErrorCode.LEDGER_UNAVAILABLE:
                    raise
        return Reservation.model_validate(self._call("POST", "/v1/reservations", body))

    def close_reservation(self, reservation_id: str,
                          outcome: Literal["succeeded", "failed", "cancelled"]) -> None:
        """``POST /v1/reservations/{rid}/close``."""
        self._call("POST", f"/v1/reservations/{reservation_id}/close",
                   CloseRequest(outcome=outcome).model_dump(mode="json"))

    def plan_size_release(self, request: SizeReleasePlanRequest) -> SizeReleasePlan:
        """``POST /v1/size-release-plans`` (stateless: charges nothing)."""
        return SizeReleasePlan.model_validate(self._call(
            "POST", "/v1/size-release-plans", request.model_dump(mode="json")))

    def release_histogram(self, dataset_id: str,
                          request: HistogramRequest) -> HistogramRelease:
        """``POST /v1/budgets/{dataset_id}/histogram-releases`` (never retried: a lost answer
        may have charged; a new release is a new charge)."""
        return HistogramRelease.model_validate(self._call(
            "POST", f"/v1/budgets/{dataset_id}/histogram-releases",
            request.model_dump(mode="json")))

    def set_class_sizes(self, dataset_id: str, request: SetClassSizes) -> BudgetView:
        """``PUT /v1/budgets/{dataset_id}/class-sizes``."""
        return BudgetView.model_validate(self._call(
            "PUT", f"/v1/budgets/{dataset_id}/class-sizes", request.model_dump(mode="json")))

    def _readyz(self) -> tuple[int, str | None]:
        """The ledger's ``/readyz`` status and problem code (0, None when unreachable)."""
        try:
            response = self._client.get("/readyz")
        except httpx.HTTPError:
            return 0, None
        code = None
        if response.status_code != 200:
            try:
                code = response.json().get("code")
            except ValueError:
                code = None
        return response.status_code, code

    def ready(self) -> bool:
        """True when the ledger's ``/readyz`` answers 200, or 503 ``ledger_behind_anchor``
        (reads work; writes wait for ``dpsynth ledger reconcile-after-restore``)."""
        status, code = self._readyz()
        return status == 200 or code == ErrorCode.LEDGER_BEHIND_ANCHOR

    def behind_anchor(self) -> bool:
        """True when the ledger's ``/readyz`` answers 503 ``ledger_behind_anchor``."""
        return self._readyz()[1] == ErrorCode.LEDGER_BEHIND_ANCHOR

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    # -- export, verification and policies (issue 4) --------------------------------------
    def entries(self, dataset_id: str) -> list[LedgerEntry]:
        """``GET /v1/entries?dataset_id=`` page by page, in seq order."""
        out: list[LedgerEntry] = []
        after = 0
        while True:
            page = self._call("GET", f"/v1/entries?dataset_id={dataset_id}&after_seq={after}"
                              f"&limit={ENTRIES_PAGE}")
            rows = [LedgerEntry.model_validate(row) for row in page or []]
            out.extend(rows)
            if len(rows) < ENTRIES_PAGE:
                return out
            after = rows[-1].seq

    def chain_key(self) -> ChainKey | None:
        """``GET /v1/chain/key`` (None when the ledger signs nothing: 404)."""
        try:
            return ChainKey.model_validate(self._call("GET", "/v1/chain/key"))
        except DpsynthError as err:
            if err.code == ErrorCode.NOT_FOUND:
                return None
            raise

    def verify_budget(self, dataset_id: str) -> VerifyReport:
        """``GET /v1/budgets/{dataset_id}/verify``."""
        return VerifyReport.model_validate(self._call("GET", f"/v1/budgets/{dataset_id}/verify"))

    def recompute(self, dataset_id: str) -> RecomputeReport:
        """``GET /v1/budgets/{dataset_id}/recompute`` (a report; nothing is written)."""
        return RecomputeReport.model_validate(
            self._call("GET", f"/v1/budgets/{dataset_id}/recompute"))

    def update_limit(self, dataset_id: str, request: LimitUpdate) -> BudgetView:
        """``POST /v1/budgets/{dataset_id}/limit``."""
        return BudgetView.model_validate(self._call(
            "POST", f"/v1/budgets/{dataset_id}/limit", request.model_dump(mode="json",
                                                                          exclude_none=True)))

    def reconcile(self, request: ReconcileRequest) -> ReconcileReport:
        """``POST /v1/admin/reconcile`` (never retried: it writes; running it again is safe,
        it re-charges nothing twice)."""
        return ReconcileReport.model_validate(self._call(
            "POST", "/v1/admin/reconcile", request.model_dump(mode="json")))

    def anchor_status(self) -> AnchorStatus:
        """``GET /v1/anchor``."""
        return AnchorStatus.model_validate(self._call("GET", "/v1/anchor"))

    # -- non-DP evaluation reads (issue 5) -------------------------------------------------
    def authorise_evaluation(self, request: EvaluationRequest) -> Evaluation:
        """``POST /v1/evaluations``; idempotent on ``job_id`` in the ledger, so a request
        whose answer was lost is sent again (like :meth:`reserve`)."""
        body = request.model_dump(mode="json")
        for _ in range(RESERVE_ATTEMPTS - 1):
            try:
                return Evaluation.model_validate(self._call("POST", "/v1/evaluations", body))
            except DpsynthError as err:
                if err.code != ErrorCode.LEDGER_UNAVAILABLE:
                    raise
        return Evaluation.model_validate(self._call("POST", "/v1/evaluations", body))

    def evaluations(self, dataset_id: str) -> list[Evaluation]:
        """``GET /v1/datasets/{dataset_id}/evaluations``."""
        data = self._call("GET", f"/v1/datasets/{dataset_id}/evaluations")
        rows = data.get("items", []) if isinstance(data, dict) else data
        return [Evaluation.model_validate(row) for row in rows or []]
