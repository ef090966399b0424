"""An in-process fake of the dpsynth api (an httpx transport), for client and CLI tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, code: str, detail: str, **ext: Any) -> httpx.Response:
    body = {"type": f"https://dpsynth.dev/problems/{code}", "title": code, "status": status,
            "detail": detail, "code": code, **ext}
    return httpx.Response(status, content=json.dumps(body).encode(),
                          headers={"content-type": "application/problem+json"})


@dataclass
class FakeApi:
    """Routes ``(method, path)`` to handlers and records every request it saw."""

    key: str = "dps_test_key"
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def route(self, method: str, path: str, handler: Handler | Any) -> None:
        if not callable(handler):
            body = handler
            handler = lambda _req: httpx.Response(200, json=body)  # noqa: E731
        self.routes[(method, path)] = handler

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return problem(401, "unauthenticated", "bad key")
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return problem(404, "not_found", f"no route {request.method} {request.url.path}")
        return handler(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)
