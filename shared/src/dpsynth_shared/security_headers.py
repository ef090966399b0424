"""Security headers on every HTTP response of the api and the ledger (pure ASGI).

* ``X-Content-Type-Options: nosniff`` on every response;
* ``Cache-Control: no-store`` on every response that does not set its own (API bodies
  may be private: budgets, dataset sizes, artifacts);
* a strict ``Content-Security-Policy`` (nothing may load, nothing may frame it) on every
  response that does not set its own: the dashboard and the HTML reports keep theirs, and
  the interactive OpenAPI pages (``/docs``, ``/redoc``), which load scripts, get none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

STRICT_CSP = "default-src 'none'; frame-ancestors 'none'"
DOC_PATHS = ("/docs", "/redoc")
ERROR_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
                 "Content-Security-Policy": STRICT_CSP}
"""The same headers, for the last-resort 500 handlers: Starlette answers an unhandled error
from its outermost middleware, outside :class:`SecurityHeadersMiddleware`, so those handlers
set them on their response themselves."""

_Message = MutableMapping[str, Any]
_App = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[_Message]],
                 Callable[[_Message], Awaitable[None]]], Awaitable[None]]


class SecurityHeadersMiddleware:
    """Add the headers above to each ``http.response.start`` that lacks them."""

    def __init__(self, app: _App, *, csp: str = STRICT_CSP,
                 csp_exempt: Iterable[str] = DOC_PATHS) -> None:
        self.app = app
        self.csp = csp.encode("latin-1")
        self.csp_exempt = tuple(csp_exempt)

    async def __call__(self, scope: MutableMapping[str, Any],
                       receive: Callable[[], Awaitable[_Message]],
                       send: Callable[[_Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        exempt = any(path == p or path.startswith(p + "/") for p in self.csp_exempt)

        async def with_headers(message: _Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {bytes(name).lower() for name, _ in headers}
                extra = [(b"x-content-type-options", b"nosniff"),
                         (b"cache-control", b"no-store")]
                if not exempt:
                    extra.append((b"content-security-policy", self.csp))
                headers += [(name, value) for name, value in extra if name not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
