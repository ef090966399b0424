"""The ledger's one table from error codes to HTTP, and its problem+json handlers."""

from __future__ import annotations

import logging

from dpsynth_shared.errors import HTTP_STATUS, PROBLEM_CONTENT_TYPE, DpsynthError, ErrorCode
from dpsynth_shared.security_headers import ERROR_HEADERS
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_STARLETTE_CODES: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
}
"""Starlette's own errors (a body it cannot parse, an unknown route) → the stable codes."""

LEDGER_STATUS: dict[ErrorCode, int] = HTTP_STATUS
"""Code → status for every error the ledger raises (the shared contract's table, unchanged)."""


def problem_response(err: DpsynthError, instance: str | None = None, *,
                     status: int | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    """An RFC 9457 problem+json response for a domain error (``status`` overrides the
    table: a 405 is ``invalid_request`` answered with 405)."""
    if status is None:
        status = LEDGER_STATUS.get(err.code, 500) if isinstance(err.code, ErrorCode) else 500
    body = err.to_problem(instance).model_dump(exclude_none=True)
    body["status"] = status
    headers = dict(headers or {})
    retry = err.extensions.get("retry_after_s")  # ledger_busy: when to come back
    if isinstance(retry, int | float) and not isinstance(retry, bool):
        headers["Retry-After"] = str(int(retry))
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE,
                        headers=headers or None)


def http_problem(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's HTTPException as a problem: a malformed JSON body (400 invalid_request),
    an unknown route (404 not_found), a wrong method (405 invalid_request, ``Allow`` kept);
    the body's ``status`` is the HTTP status (api: dpsynth_api.errors._http_error)."""
    if exc.status_code == 405:
        error = DpsynthError(ErrorCode.INVALID_REQUEST, f"method {request.method} is not allowed")
        return problem_response(error, request.url.path, status=405,
                                headers=dict(exc.headers or {}))
    code = _STARLETTE_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.url.path}"
    return problem_response(DpsynthError(code, detail), request.url.path,
                            status=exc.status_code, headers=dict(exc.headers or {}))


def install(app: FastAPI) -> None:
    """Register the handlers: domain errors, validation errors, and the last resort."""

    @app.exception_handler(DpsynthError)
    async def _domain(request: Request, exc: DpsynthError) -> JSONResponse:
        return problem_response(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_problem(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The last resort: a problem+json 500 with no detail (the log has the traceback),
        # never Starlette's plain-text page.
        log.exception("unhandled error")
        return problem_response(DpsynthError(ErrorCode.INTERNAL, "internal error"),
                                request.url.path, headers=ERROR_HEADERS)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return problem_response(DpsynthError(ErrorCode.INVALID_REQUEST,
                                             "the request body is invalid", errors=errors),
                                request.url.path)
