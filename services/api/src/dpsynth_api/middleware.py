"""Pure-ASGI middleware: request ids + metrics + access log, credential-in-URL refusal,
the upload size cap (counted on the wire, before the multipart parser spools it), and
security headers (:mod:`dpsynth_shared.security_headers`, shared with the ledger)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any
from urllib.parse import parse_qsl

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.logging import request_id_var
from dpsynth_shared.security_headers import SecurityHeadersMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpsynth_api.errors import problem_response
from dpsynth_api.metrics import ApiMetrics
from dpsynth_api.tenants.security import looks_like_key_in_query
from dpsynth_api.uploads import too_large

log = logging.getLogger("dpsynth_api.access")

__all__ = ["GuardMiddleware", "ObservabilityMiddleware", "SecurityHeadersMiddleware"]


class ObservabilityMiddleware:
    """A request id (``X-Request-ID``, echoed), one JSON access line, request metrics by
    route template (never by raw path: ids would explode the label space)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        incoming = headers.get(b"x-request-id", b"").decode("latin-1")[:64]
        request_id = incoming if incoming.isprintable() and incoming else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"],
                                      (b"x-request-id", request_id.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(method=scope["method"], route=route,
                                         status=str(status)).inc()
            self.metrics.latency.labels(method=scope["method"], route=route).observe(elapsed)
            log.info("request", extra={"method": scope["method"], "route": route,
                                       "status": status, "duration_ms": round(elapsed * 1e3, 1)})
            request_id_var.reset(token)


class GuardMiddleware:
    """Refuse credentials in query strings (400) and bodies over the upload cap (413)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                               keep_blank_values=True))
        if looks_like_key_in_query(query):
            error = DpsynthError(ErrorCode.KEY_IN_QUERY, "API keys are accepted only in the "
                                 "Authorization header (Bearer), never in a query string")
            await problem_response(error)(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await problem_response(too_large(self.max_body_bytes))(scope, receive, send)
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A chunked body without Content-Length: count it, and answer 413 instead of
        # whatever the app makes of a body cut short.
        state: dict[str, Any] = {"seen": 0, "over": False, "replaced": False}

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > self.max_body_bytes:
                    state["over"] = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if state["over"]:
                if message["type"] == "http.response.start" and not state["replaced"]:
                    state["replaced"] = True
                    await problem_response(too_large(self.max_body_bytes))(
                        scope, counting_receive, send)
                return
            await send(message)

        await self.app(scope, counting_receive, guarded_send)
