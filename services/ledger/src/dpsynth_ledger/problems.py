"""The ledger's one table from error codes to HTTP, and its problem+json handlers."""

from __future__ import annotations

import logging

from dpsynth_shared.errors import HTTP_STATUS, PROBLEM_CONTENT_TYPE, DpsynthError, ErrorCode
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

LEDGER_STATUS: dict[ErrorCode, int] = HTTP_STATUS
"""Code → status for every error the ledger raises (the shared contract's table, unchanged)."""


def problem_response(err: DpsynthError, instance: str | None = None) -> JSONResponse:
    """An RFC 9457 problem+json response for a domain error."""
    status = LEDGER_STATUS.get(err.code, 500) if isinstance(err.code, ErrorCode) else 500
    body = err.to_problem(instance).model_dump(exclude_none=True)
    body["status"] = status
    retry = err.extensions.get("retry_after_s")  # ledger_busy: when to come back
    headers = {"Retry-After": str(int(retry))} if isinstance(retry, int | float) else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE,
                        headers=headers)


def install(app: FastAPI) -> None:
    """Register the handlers: domain errors, validation errors, and the last resort."""

    @app.exception_handler(DpsynthError)
    async def _domain(request: Request, exc: DpsynthError) -> JSONResponse:
        return problem_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return problem_response(DpsynthError(ErrorCode.INVALID_REQUEST,
                                             "the request body is invalid", errors=errors),
                                request.url.path)
