"""HTTP adapters of :mod:`dpsynth_worker.ports` over httpx, with bearer tokens.

Transient network errors are retried a few times with exponential backoff: any transport
error for reads, only connection failures (the request never left) for writes, so a lease
is never requested twice by a retry. Problem+json answers become :class:`DpsynthError`.

A claim is the exception: it waits much longer for an unreachable api (a worker often
starts before the api listens, issue 14, item 2), then raises :class:`ClaimUnavailable`
so the task's message goes back to the queue instead of being dropped. Retrying a claim
is safe: the api accepts exactly one claim per attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TypedDict, TypeVar, Unpack

import httpx
from dpsynth_shared.errors import DpsynthError, ErrorCode, error_from_problem
from dpsynth_shared.ledger_contract import (
    BudgetView,
    CloseRequest,
    ExtendRequest,
    GdpEnvelope,
    GdpEnvelopeRequest,
    Lease,
    LeaseRequest,
    ReadGrant,
    ReadGrantRequest,
    Reservation,
)
from dpsynth_shared.release_contract import (
    CentralImagesRelease,
    CentralImagesRequest,
    DpEvaluationRelease,
    DpEvaluationRequest,
    EvaluationGrantRequest,
)
from dpsynth_shared.worker_contract import (
    Claim,
    ClaimRequest,
    Heartbeat,
    HeartbeatReply,
    ProposeTransition,
    RegisterArtifact,
    RegisteredArtifact,
)
from pydantic import BaseModel

from dpsynth_worker.ports import CloseOutcome, JobEpsilon, StepsUsed

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
_RETRY_STATUS = frozenset({502, 503, 504})
_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Codes of a claim the api (or the ledger behind it) could not take now: retried.
_UNREACHABLE = frozenset({ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.LEDGER_UNAVAILABLE})
_CLAIM_BACKOFF_S = (0.5, 10.0)  # first wait, cap


class ClaimUnavailable(DpsynthError):
    """The api could not take a claim within the worker's patience (or the worker is
    stopping): the job is still queued, so its message must be requeued, not acked."""


class HttpOptions(TypedDict, total=False):
    """Tuning of a client's HTTP calls (tests pass a transport)."""

    retries: int
    backoff_s: float
    timeout_s: float
    transport: httpx.BaseTransport | None


class _Http:
    """A bearer-token JSON client with retries and problem+json decoding."""

    def __init__(self, base_url: str, token: str, *, unavailable: ErrorCode,
                 retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s,
                                    headers={"Authorization": f"Bearer {token}"},
                                    transport=transport)
        self._unavailable = unavailable
        self._retries = retries
        self._backoff_s = backoff_s

    def close(self) -> None:
        self._client.close()

    def request(self, method: str, path: str,
                body: BaseModel | Mapping[str, object] | None = None) -> object:
        """Send one request; return the decoded JSON body (None when empty)."""
        payload = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        retry_on: tuple[type[Exception], ...] = (
            (httpx.TransportError,) if method == "GET" else _CONNECT_ERRORS)
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                response = self._client.request(method, path, json=payload)
            except httpx.TransportError as exc:
                if last or not isinstance(exc, retry_on):
                    raise DpsynthError(self._unavailable, f"{method} {path}: "
                                       f"{type(exc).__name__}") from exc
                self._sleep(attempt, method, path, type(exc).__name__)
                continue
            if response.status_code in _RETRY_STATUS and not last:
                self._sleep(attempt, method, path, str(response.status_code))
                continue
            return _decode(response, self._unavailable)
        raise AssertionError("unreachable")  # pragma: no cover

    def _sleep(self, attempt: int, method: str, path: str, why: str) -> None:
        delay = self._backoff_s * (2**attempt)
        log.warning("transient error, retrying", extra={"method": method, "path": path,
                                                         "why": why, "retry_in_s": delay})
        time.sleep(delay)


def _decode(response: httpx.Response, unavailable: ErrorCode) -> object:
    if response.is_success:
        return response.json() if response.content else None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        raise error_from_problem(body)
    code = unavailable if response.status_code >= 500 else ErrorCode.INVALID_REQUEST
    raise DpsynthError(code, f"HTTP {response.status_code} without a problem body")


def _parse(model: type[M], data: object) -> M:
    return model.model_validate(data)


class ApiClient:
    """The api's internal worker endpoints (``/internal/v1``, the WORKER_TOKEN).

    Args:
        claim_patience_s: how long :meth:`claim` waits for an unreachable api.
        stop: set when the worker shuts down; a waiting claim then gives up at once.
    """

    def __init__(self, base_url: str, token: str, *, claim_patience_s: float = 60.0,
                 stop: threading.Event | None = None, **kwargs: Unpack[HttpOptions]) -> None:
        self._http = _Http(base_url, token, unavailable=ErrorCode.SERVICE_UNAVAILABLE, **kwargs)
        self._claim_patience_s = claim_patience_s
        self._stop = stop or threading.Event()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def claim(self, job_id: str, *, attempt: int, worker_id: str) -> Claim:
        """Claim ``attempt`` of a job; raises ``claim_refused`` for a stale message and
        :class:`ClaimUnavailable` when the api stayed unreachable for the patience."""
        body = ClaimRequest(attempt=attempt, worker_id=worker_id)
        deadline = time.monotonic() + self._claim_patience_s
        delay, cap = _CLAIM_BACKOFF_S
        while True:
            try:
                return _parse(Claim, self._http.request(
                    "POST", f"/internal/v1/jobs/{job_id}/claim", body))
            except DpsynthError as exc:
                if exc.code not in _UNREACHABLE:
                    raise
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    raise ClaimUnavailable(exc.code, f"the api could not take the claim: "
                                           f"{exc.detail}") from exc
                wait = min(delay, left)
                log.warning("the api cannot take the claim yet; waiting", extra={
                    "attempt": attempt, "code": str(exc.code), "retry_in_s": wait})
            if self._stop.wait(wait):
                raise ClaimUnavailable(ErrorCode.SERVICE_UNAVAILABLE,
                                       "the worker is stopping; the claim was not made")
            delay = min(2 * delay, cap)

    def heartbeat(self, job_id: str, beat: Heartbeat) -> HeartbeatReply:
        """Post data-independent progress; the reply says whether cancel was requested."""
        data = self._http.request("POST", f"/internal/v1/jobs/{job_id}/heartbeat", beat)
        return _parse(HeartbeatReply, data)

    def register_artifact(self, job_id: str, artifact: RegisterArtifact) -> RegisteredArtifact:
        """Register an uploaded output object of the job."""
        data = self._http.request("POST", f"/internal/v1/jobs/{job_id}/artifacts", artifact)
        return _parse(RegisteredArtifact, data)

    def propose_transition(self, job_id: str, proposal: ProposeTransition) -> None:
        """Propose the job's next state (the api decides)."""
        self._http.request("POST", f"/internal/v1/jobs/{job_id}/transition", proposal)


class LedgerClient:
    """The ledger's reservation, lease and budget endpoints (a service token)."""

    def __init__(self, base_url: str, token: str, **kwargs: Unpack[HttpOptions]) -> None:
        self._http = _Http(base_url, token, unavailable=ErrorCode.LEDGER_UNAVAILABLE, **kwargs)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def get_reservation(self, reservation_id: str) -> Reservation:
        """Read a reservation (its DP event is what the trainer must use, verbatim)."""
        return _parse(Reservation,
                      self._http.request("GET", f"/v1/reservations/{reservation_id}"))

    def read_grant(self, reservation_id: str, *, attempt: int, worker_id: str) -> ReadGrant:
        """Obtain a read grant for the reservation's private dataset (touches it)."""
        body = ReadGrantRequest(attempt=attempt, worker_id=worker_id)
        data = self._http.request("POST", f"/v1/reservations/{reservation_id}/read-grants", body)
        return _parse(ReadGrant, data)

    def evaluation_grant(self, evaluation_id: str, *, attempt: int,
                         worker_id: str) -> ReadGrant:
        """Exchange an evaluation authorisation for a read grant of the budget's private
        prefix (the ledger writes an ``evaluation_read`` entry; nothing is charged)."""
        body = EvaluationGrantRequest(attempt=attempt, worker_id=worker_id)
        data = self._http.request("POST", f"/v1/evaluations/{evaluation_id}/grant", body)
        return _parse(ReadGrant, data)

    def dp_evaluation_release(self, evaluation_id: str,
                              request: DpEvaluationRequest) -> DpEvaluationRelease:
        """Charge a DP evaluation release to the budget's held-out partition (issue 13,
        item 6); the noise is drawn by the caller only after this returns."""
        data = self._http.request("POST", f"/v1/evaluations/{evaluation_id}/dp-releases",
                                  request)
        return _parse(DpEvaluationRelease, data)

    def central_images_release(self, reservation_id: str,
                               request: CentralImagesRequest) -> CentralImagesRelease:
        """Charge (or with ``dry_run`` calibrate) a finetune's central-image release; the
        noise is drawn by the caller only after a charged answer. A write: retried only when
        the request never left (a repeated release would be charged twice)."""
        data = self._http.request("POST",
                                  f"/v1/reservations/{reservation_id}/central-images", request)
        return _parse(CentralImagesRelease, data)

    def lease(self, reservation_id: str, *, attempt: int, start_step: int, steps: int,
              partition: str | None = None) -> Lease:
        """Lease steps ``[start_step, start_step + steps)``; they are charged when granted.

        ``partition`` names the class of a per-label job (its steps count from 0).
        """
        body = LeaseRequest(attempt=attempt, start_step=start_step, steps=steps,
                            partition=partition).model_dump(mode="json", exclude_none=True)
        data = self._http.request("POST", f"/v1/reservations/{reservation_id}/leases", body)
        return _parse(Lease, data)

    def end_lease(self, reservation_id: str, lease_id: str) -> None:
        """End a lease early (never refunds its steps)."""
        self._http.request("POST", f"/v1/reservations/{reservation_id}/leases/{lease_id}/end")

    def extend(self, reservation_id: str, *, attempt: int, additional_steps: int,
               partition: str | None = None) -> Reservation:
        """Ask for steps beyond the reservation (a new admission through the filter; per
        label, for the class ``partition`` against that class's accumulator)."""
        body = ExtendRequest(attempt=attempt, additional_steps=additional_steps,
                             partition=partition).model_dump(mode="json", exclude_none=True)
        data = self._http.request("POST", f"/v1/reservations/{reservation_id}/extend", body)
        return _parse(Reservation, data)

    def close_reservation(self, reservation_id: str, *, outcome: CloseOutcome) -> None:
        """Close a reservation: commit granted steps, release the rest."""
        body = CloseRequest(outcome=outcome)
        self._http.request("POST", f"/v1/reservations/{reservation_id}/close", body)

    def job_epsilon(self, *, dataset_id: str, reservation_ids: list[str],
                    steps_used: StepsUsed | None = None) -> JobEpsilon:
        """Standalone epsilon of the steps that produced a model (``steps_used`` per
        reservation where fewer than granted), composed over the reservations."""
        body: dict[str, object] = {"dataset_id": dataset_id,
                                   "reservation_ids": reservation_ids}
        if steps_used:
            body["steps_used"] = steps_used
        return _parse(JobEpsilon, self._http.request("POST", "/v1/job-epsilon", body))

    def gdp_envelope(self, *, noise_multiplier: float, sample_rate: float,
                     steps: int) -> GdpEnvelope:
        """The Gaussian-DP envelope of a DP-SGD run (σ, q, steps): the μ an audit tests and
        the additive tail δ (stateless on the ledger; a heavy computation there, so a busy
        ledger's 503 is retried like any other)."""
        body = GdpEnvelopeRequest(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                  steps=steps)
        return _parse(GdpEnvelope, self._http.request("POST", "/v1/gdp-envelopes", body))

    def budget_view(self, dataset_id: str) -> BudgetView:
        """The dataset's budget view (filter figure, tight figure, order, accountant)."""
        return _parse(BudgetView, self._http.request("GET", f"/v1/budgets/{dataset_id}"))
