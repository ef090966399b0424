"""Per-key rate limits in a real Redis (issue 14, item 12).

Each test's api gets low limits through its own settings; the suite's other apps keep the
defaults, which are above what the service-load benchmark sends.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpsynth_client import Client
from sqlalchemy import create_engine, text

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b


def _limited(make_api: Any, redis_url: str, **limits: Any) -> Api:
    api: Api = make_api(broker_url=redis_url, **limits)
    return api


def test_429_with_retry_after_then_allowed_and_other_tenants_unaffected(
        make_api: Any, redis_url: str) -> None:
    api = _limited(make_api, redis_url, rate_limit_requests_per_s=2.0,
                   rate_limit_requests_burst=3)
    _, noisy = api.tenant("noisy")
    _, quiet = api.tenant("quiet")
    for _ in range(3):
        assert api.client.get("/v1/datasets", headers=auth(noisy)).status_code == 200
    r = api.client.get("/v1/datasets", headers=auth(noisy))
    assert r.status_code == 429 and r.json()["code"] == "rate_limited"
    assert r.headers["content-type"] == "application/problem+json"
    retry_after = int(r.headers["retry-after"])
    assert 1 <= retry_after <= math.ceil(1 / 2.0)
    # another tenant's key draws on its own buckets
    assert api.client.get("/v1/datasets", headers=auth(quiet)).status_code == 200
    # health, readiness and metrics are never limited
    for path in ("/healthz", "/readyz", "/metrics"):
        assert api.client.get(path).status_code != 429
    time.sleep(retry_after)
    assert api.client.get("/v1/datasets", headers=auth(noisy)).status_code == 200


def test_uploads_have_their_own_limit(make_api: Any, redis_url: str) -> None:
    api = _limited(make_api, redis_url, rate_limit_uploads_per_s=0.1,
                   rate_limit_uploads_burst=1)
    _, token = api.tenant()
    data = b.zip_bytes(b.image_folder({"a": 3, "b": 3}))
    first = api.upload(token, data, {"name": "one", "visibility": "public"})
    assert first.status_code == 201, first.text
    second = api.upload(token, data, {"name": "two", "visibility": "public"})
    assert second.status_code == 429 and second.json()["code"] == "rate_limited"
    assert int(second.headers["retry-after"]) >= 9
    # the key's other requests are not held back by its upload bucket
    assert api.client.get("/v1/datasets", headers=auth(token)).status_code == 200


def test_upload_bytes_are_limited(make_api: Any, redis_url: str) -> None:
    data = b.zip_bytes(b.image_folder({"a": 3, "b": 3}))
    api = _limited(make_api, redis_url, rate_limit_upload_bytes_per_s=100.0,
                   rate_limit_upload_bytes_burst=len(data) * 3 // 2)
    _, token = api.tenant()
    assert api.upload(token, data, {"name": "one", "visibility": "public"}).status_code == 201
    r = api.upload(token, data, {"name": "two", "visibility": "public"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 1


def test_unreachable_redis_fails_open(make_api: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Limits guard capacity, not privacy: without Redis, requests pass and a warning says
    the limits are not enforced (docs/hardening-requests.md)."""
    api: Api = make_api(rate_limit_redis_url="redis://127.0.0.1:9/0",
                        rate_limit_requests_per_s=0.01, rate_limit_requests_burst=1)
    _, token = api.tenant()
    with caplog.at_level(logging.WARNING, logger="dpsynth_api.ratelimit"):
        for _ in range(3):
            assert api.client.get("/v1/datasets", headers=auth(token)).status_code == 200
    assert any("failing open" in r.getMessage() for r in caplog.records)


def test_the_client_retries_a_429_once_and_sends_idempotency_keys(
        make_api: Any, redis_url: str, tmp_path: Path) -> None:
    api = _limited(make_api, redis_url, rate_limit_uploads_per_s=0.5,
                   rate_limit_uploads_burst=1)
    _, token = api.tenant()
    statuses: list[int] = []
    path = tmp_path / "d.zip"
    path.write_bytes(b.zip_bytes(b.image_folder({"a": 3, "b": 3})))
    def forward(request: httpx.Request) -> httpx.Response:  # the typed client → the real app
        r = api.client.request(request.method, request.url.path, content=request.read(),
                               headers=dict(request.headers))
        statuses.append(r.status_code)
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    client = Client("http://testserver", token, transport=httpx.MockTransport(forward))
    first = client.upload_dataset(path, name="one", visibility="public")
    second = client.upload_dataset(path, name="two", visibility="public")  # 429, then 201
    assert first["dataset_id"] != second["dataset_id"] and statuses == [201, 429, 201]
    engine = create_engine(api.settings.database.url)
    try:
        with engine.connect() as conn:
            keys = conn.execute(text("select count(*) from api.idempotency_keys")).scalar_one()
    finally:
        engine.dispose()
    assert keys == 2


def test_made_up_keys_buy_no_fresh_buckets(make_api: Any, redis_url: str) -> None:
    """A flood of invented tokens (each a key lookup and a 401) draws on its address's
    unknown-caller bucket, not on a fresh bucket per token; a key already accepted does not
    draw on that bucket, so the flood does not hold it back."""
    import secrets

    api = _limited(make_api, redis_url, rate_limit_unknown_per_s=0.1,
                   rate_limit_unknown_burst=5)
    _, token = api.tenant()
    assert api.client.get("/v1/datasets", headers=auth(token)).status_code == 200  # accepted
    answers = [api.client.get("/v1/datasets", headers=auth(
        f"dps_{secrets.token_hex(16)}_{secrets.token_hex(32)}")).status_code for _ in range(12)]
    assert set(answers) == {401, 429} and answers.count(401) <= 5, answers
    assert answers[-1] == 429
    for _ in range(3):
        assert api.client.get("/v1/datasets", headers=auth(token)).status_code == 200
