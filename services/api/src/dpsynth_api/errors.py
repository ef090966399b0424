"""The api's one mapping from errors to RFC 9457 problem+json.

Domain code raises :class:`DpsynthError`; its code's status comes from
:data:`dpsynth_shared.errors.HTTP_STATUS` (the one table). FastAPI's validation errors become
422 ``invalid_spec`` (job specs) or ``invalid_request``; Starlette's 404/405 become problems too.

A problem with per-field ``errors`` lists each once, cleaned (``field``: the path the user
wrote, ``msg`` without pydantic's prefixes and URLs), and its ``detail`` only names the fields
(:func:`dpsynth_shared.field_errors.with_clean_field_errors`), so no message is printed twice.
"""

from __future__ import annotations

import logging
from typing import Any

from dpsynth_shared.errors import PROBLEM_CONTENT_TYPE, DpsynthError, ErrorCode
from dpsynth_shared.field_errors import field_errors, field_errors_detail, with_clean_field_errors
from dpsynth_shared.security_headers import ERROR_HEADERS
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_STARLETTE_CODES: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
}


def problem_response(error: DpsynthError, request: Request | None = None, *,
                     status: int | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    """The problem+json response of a domain error (``status`` overrides the table)."""
    instance = request.url.path if request is not None else None
    problem = with_clean_field_errors(error).to_problem(instance=instance)
    body = problem.model_dump(mode="json", exclude_none=True)
    if status is not None:
        body["status"] = status
    return JSONResponse(jsonable_encoder(body), status_code=body["status"],
                        media_type=PROBLEM_CONTENT_TYPE, headers=headers)


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DpsynthError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.code == ErrorCode.UNAUTHENTICATED else {}
    retry = exc.extensions.get("retry_after_s")  # e.g. the ledger's ledger_busy, passed on
    if isinstance(retry, int | float) and not isinstance(retry, bool) and retry >= 0:
        headers["Retry-After"] = str(max(1, round(retry)))
    if exc.status >= 500:
        log.warning("request failed", extra={"code": str(exc.code)})
    return problem_response(exc, request, headers=headers or None)


def _union_tag(body: Any) -> str | None:
    """The discriminator a job spec's errors are nested under (``finetune``), left out of
    the field path the user sees (``privacy.target_epsilon``)."""
    tag = body.get("type") if isinstance(body, dict) else None
    return tag if isinstance(tag, str) else None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    is_spec = request.url.path.rstrip("/") == "/v1/jobs"
    code = ErrorCode.INVALID_SPEC if is_spec else ErrorCode.INVALID_REQUEST
    # never echo the submitted input back (it may be a private file's bytes or a key)
    errors = field_errors(exc.errors(), tag=_union_tag(exc.body) if is_spec else None)
    head = "invalid job spec" if is_spec else "invalid request"
    error = DpsynthError(code, field_errors_detail(head, errors), errors=errors)
    return problem_response(error, request, status=422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        error = DpsynthError(ErrorCode.INVALID_REQUEST, f"method {request.method} is not allowed")
        return problem_response(error, request, status=405, headers=dict(exc.headers or {}))
    code = _STARLETTE_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.url.path}"
    return problem_response(DpsynthError(code, detail), request, status=exc.status_code)


async def _pool_exhausted(request: Request, exc: Exception) -> JSONResponse:
    # Every database connection is busy (a burst of submissions waiting on admissions):
    # nothing was read or written, so the client may simply retry.
    log.warning("database pool exhausted")
    error = DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, "the api is overloaded (no free "
                         "database connection); retry shortly")
    return problem_response(error, request, headers={"Retry-After": "2"})


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error")
    return problem_response(DpsynthError(ErrorCode.INTERNAL, "internal error"), request,
                            headers=ERROR_HEADERS)


def install_error_handlers(app: FastAPI) -> None:
    """Register the problem+json handlers on ``app``."""
    app.add_exception_handler(DpsynthError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(PoolTimeout, _pool_exhausted)
    app.add_exception_handler(Exception, _unexpected_error)
