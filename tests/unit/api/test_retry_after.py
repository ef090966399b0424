"""A problem that says when to come back carries ``Retry-After`` (issue 14, item 1: the
ledger's 503 ``ledger_busy`` passed on by the api must keep its hint)."""

from __future__ import annotations

from dpsynth_api.errors import install_error_handlers
from dpsynth_shared.errors import DpsynthError, ErrorCode, error_from_problem
from fastapi import FastAPI
from fastapi.testclient import TestClient


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/busy")
    def busy() -> None:  # as the ledger adapter raises it from the ledger's problem body
        raise error_from_problem({"type": "about:blank", "title": "busy", "status": 503,
                                  "detail": "no slot", "code": "ledger_busy",
                                  "retry_after_s": 2.4})

    @app.get("/bug")
    def bug() -> None:
        raise RuntimeError("secret detail")

    @app.get("/plain")
    def plain() -> None:
        raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE, "down")

    return app


def test_retry_after_follows_the_problem() -> None:
    client = TestClient(_app())
    r = client.get("/busy")
    assert r.status_code == 503 and r.json()["code"] == "ledger_busy"
    assert r.headers["retry-after"] == "2"
    assert "retry-after" not in client.get("/plain").headers


def test_a_500_carries_the_security_headers() -> None:
    """Starlette answers an unhandled error outside the security-headers middleware, so
    the last-resort handler sets them itself (issue 14, item 14)."""
    r = TestClient(_app(), raise_server_exceptions=False).get("/bug")
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    assert "secret" not in r.text
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
