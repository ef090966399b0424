"""Turn HTTP failures back into the platform's domain errors."""

from __future__ import annotations

from typing import Any

import httpx
from dpsynth_shared.errors import DpsynthError, ErrorCode, error_from_problem


class ApiError(DpsynthError):
    """A :class:`DpsynthError` rebuilt from a problem+json body, keeping the HTTP status.

    ``status`` is the status the server answered (the base class derives it from the code,
    which is wrong for codes this client does not know yet).
    """

    def __init__(self, code: ErrorCode | str, detail: str, *, http_status: int,
                 **extensions: Any) -> None:
        super().__init__(code, detail, **extensions)
        self._http_status = http_status

    @property
    def status(self) -> int:
        return self._http_status


def raise_for_problem(response: httpx.Response) -> None:
    """Raise :class:`ApiError` for any non-2xx response (problem+json or not)."""
    if response.is_success:
        return
    if not response.is_stream_consumed:
        response.read()
    body: Any = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        err = error_from_problem(body)
        raise ApiError(err.code, err.detail, http_status=response.status_code, **err.extensions)
    if isinstance(body, dict) and "detail" in body:  # a framework error (e.g. FastAPI 422)
        raise ApiError(ErrorCode.INVALID_REQUEST if response.status_code < 500
                       else ErrorCode.INTERNAL, str(body["detail"]),
                       http_status=response.status_code)
    code = (ErrorCode.SERVICE_UNAVAILABLE if response.status_code >= 500
            else ErrorCode.INVALID_REQUEST)
    raise ApiError(code, f"HTTP {response.status_code}: {response.text[:200]}",
                   http_status=response.status_code)


def unreachable(base_url: str, exc: Exception, hint: str = "") -> ApiError:
    """The error raised when the api cannot be reached at all; ``hint`` (e.g. which
    credentials file named the URL, and how to start that platform) ends the detail."""
    detail = f"cannot reach the api at {base_url}: {exc}"
    return ApiError(ErrorCode.SERVICE_UNAVAILABLE, f"{detail}; {hint}" if hint else detail,
                    http_status=503)


class NotConfigured(Exception):
    """No api URL or key could be found (options, environment, credentials file).

    Not an HTTP error: nothing was sent, so it carries no status; the CLI prints its message
    (which says where it looked and what to do) and exits 2.
    """

    def __init__(self, message: str, *, searched: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.searched = searched


class JobFailed(Exception):
    """A job waited on ended without succeeding: ``failed`` or ``cancelled``.

    Not an HTTP error (every request succeeded); ``job`` is the final job document, so its
    ``error`` (``{code, message}``), ``progress`` and ``result`` stay at hand.
    """

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.job_id = str(job.get("job_id") or job.get("id") or "?")
        self.state = str(job.get("state"))
        raw = job.get("error")
        error: dict[str, Any] = raw if isinstance(raw, dict) else {}
        self.code: str | None = error.get("code")
        self.message = (f"job {self.job_id} was cancelled" if self.state == "cancelled"
                        else f"job {self.job_id} {self.state}")
        if self.code:
            self.message += f": {self.code}"
            if error.get("message"):
                self.message += f" ({error['message']})"
        super().__init__(self.message)
