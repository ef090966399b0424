"""Starlette's own errors are problems too (issue 14, items 4 and 15).

A body Starlette could not parse was answered ``400 application/json {"detail": "There was
an error parsing the body"}``, an unknown route or a wrong method a bare JSON 404/405. Each
is now RFC 9457 problem+json with a stable code and ``status`` equal to the HTTP status, as
the api answers them (dpsynth_api.errors._http_error).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

PROBLEM = "application/problem+json"


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "code"), [
    ("POST", "/v1/plans", {"content": b'{"dataset_id": "\xff"}',
                           "headers": {"content-type": "application/json"}},
     400, "invalid_request"),
    ("GET", "/v1/no-such-route", {}, 404, "not_found"),
    ("GET", "/no-such-route", {}, 404, "not_found"),
    ("DELETE", "/v1/budgets", {}, 405, "invalid_request"),
    ("PUT", "/v1/plans", {"json": {}}, 405, "invalid_request"),
])
def test_starlette_errors_are_problems(client: TestClient, method: str, path: str,
                                       kwargs: dict, status: int, code: str) -> None:
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["code"] == code and body["status"] == status
    assert body["instance"] == path
    if status == 405:
        assert r.headers["allow"] == "POST"
    assert client.get("/v1/chain/verify").json()["ok"] is True


def test_an_unexpected_error_is_a_problem_without_detail(settings: object) -> None:
    """The last resort: a bug answers problem+json 500 ``internal_error``, never Starlette's
    plain-text page, and says nothing of the exception."""
    from dpsynth_ledger.app import create_app

    app = create_app(settings)  # type: ignore[arg-type]

    def boom() -> None:
        raise RuntimeError("secret detail")

    app.add_api_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
    assert r.status_code == 500 and r.headers["content-type"].startswith(PROBLEM)
    assert r.json()["code"] == "internal_error" and "secret" not in r.text
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    assert "default-src 'none'" in r.headers["content-security-policy"]
