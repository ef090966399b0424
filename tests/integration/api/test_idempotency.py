"""``Idempotency-Key`` on creating POSTs (issue 14, item 8), on a real PostgreSQL.

A replay returns the first response and does not do the work again (one job, one
reservation, one dataset); another body under the same key is a 422; tenants' keys are
independent; concurrent duplicates create once; expired keys are purged. The answer is
stored before the client has it (a replay sent the moment it arrives is a replay, not a
409); a large answer, a 5xx, an exception, an unread body or a failed store free the key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest
from dpsynth_api.db import make_session_factory
from dpsynth_api.idempotency import IdempotencyMiddleware, IdempotencyStore
from sqlalchemy import create_engine, text

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b


def _spec(dataset_id: str, model_id: str, epsilon: float = 1.0) -> dict[str, Any]:
    return {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
            "privacy": {"target_epsilon": epsilon},
            "training": {"expected_batch_size": 4, "epochs": 2}}


def _submit(api: Api, token: str, spec: dict[str, Any], key: str) -> Any:
    return api.client.post("/v1/jobs", json=spec,
                           headers={**auth(token), "Idempotency-Key": key})


def _count(api: Api, sql: str) -> int:
    engine = create_engine(api.settings.database.url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


def _setup(api: Api, name: str = "acme") -> tuple[str, str, str]:
    _, token = api.tenant(name)
    return token, api.private_dataset(token), api.model(token)


def test_replay_returns_the_first_response_and_reserves_once(api: Api) -> None:
    token, dataset, model = _setup(api)
    first = _submit(api, token, _spec(dataset, model), "job-1")
    assert first.status_code == 201, first.text
    for _ in range(2):
        again = _submit(api, token, _spec(dataset, model), "job-1")
        assert again.status_code == 201 and again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["content-type"] == first.headers["content-type"]
    assert _count(api, "select count(*) from api.jobs") == 1
    assert len(api.ledger.reservations) == 1 and len(api.sender.sent) == 1
    # without a key, each POST is a new request (the behaviour before this change)
    assert api.finetune(token, dataset, model).status_code == 201
    assert _count(api, "select count(*) from api.jobs") == 2


def test_same_key_other_body_is_422_and_bad_keys_are_refused(api: Api) -> None:
    token, dataset, model = _setup(api)
    assert _submit(api, token, _spec(dataset, model), "k").status_code == 201
    r = _submit(api, token, _spec(dataset, model, epsilon=2.0), "k")
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    assert r.headers["content-type"] == "application/problem+json"
    for bad in (b"x" * 256, b"has space", "ünïcode".encode(), b""):
        r = api.client.post("/v1/jobs", json=_spec(dataset, model),
                            headers=[(b"authorization", f"Bearer {token}".encode()),
                                     (b"idempotency-key", bad)])
        assert r.status_code == 422 and r.json()["code"] == "invalid_idempotency_key"
    assert len(api.ledger.reservations) == 1


def test_a_refused_request_is_stored_too(api: Api) -> None:
    """A 4xx is the request's answer (Stripe's rule): the replay gets it, nothing runs."""
    token, dataset, model = _setup(api)
    spec = _spec(dataset, model) | {"training": {"expected_batch_size": 13, "epochs": 2}}
    first = _submit(api, token, spec, "refused")
    assert first.status_code == 422 and first.json()["code"] == "invalid_spec"
    again = _submit(api, token, spec, "refused")
    assert again.status_code == 422 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"


def test_keys_are_scoped_per_tenant(api: Api) -> None:
    token_a, dataset_a, model_a = _setup(api, "a")
    token_b, dataset_b, model_b = _setup(api, "b")
    ra = _submit(api, token_a, _spec(dataset_a, model_a), "shared-key")
    rb = _submit(api, token_b, _spec(dataset_b, model_b), "shared-key")
    assert ra.status_code == rb.status_code == 201
    assert ra.json()["job_id"] != rb.json()["job_id"]
    assert "idempotent-replayed" not in rb.headers
    for token, first in ((token_a, ra), (token_b, rb)):  # each tenant replays its own
        again = _submit(api, token, _spec(dataset_a if token == token_a else dataset_b,
                                          model_a if token == token_a else model_b),
                        "shared-key")
        assert again.headers.get("idempotent-replayed") == "true"
        assert again.json()["job_id"] == first.json()["job_id"]
    assert len(api.ledger.reservations) == 2


def test_concurrent_duplicates_create_once(api: Api) -> None:
    token, dataset, model = _setup(api)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _submit(api, token, _spec(dataset, model), "race"),
                                range(8)))
    codes = [r.status_code for r in answers]
    assert set(codes) <= {201, 409} and 201 in codes, codes
    assert len({r.json()["job_id"] for r in answers if r.status_code == 201}) == 1
    for r in answers:
        if r.status_code == 409:
            assert r.json()["code"] == "idempotency_in_progress"
            assert int(r.headers["retry-after"]) >= 1
    assert _count(api, "select count(*) from api.jobs") == 1
    assert len(api.ledger.reservations) == 1


def test_a_duplicate_of_a_request_in_flight_is_409(api: Api) -> None:
    token, dataset, model = _setup(api)
    engine = create_engine(api.settings.database.url)
    try:
        store = IdempotencyStore(make_session_factory(engine), ttl_s=60, lock_timeout_s=60)
        tenant_id = store.tenant_of(token)
        assert tenant_id is not None
        assert store.claim(tenant_id, "in-flight", "POST", "/v1/jobs") is None  # the first
        r = _submit(api, token, _spec(dataset, model), "in-flight")
        assert r.status_code == 409 and r.json()["code"] == "idempotency_in_progress"
        assert r.headers["retry-after"] == "1"
        store.release(tenant_id, "in-flight")  # the first failed (a 5xx): the key is free
    finally:
        engine.dispose()
    assert _submit(api, token, _spec(dataset, model), "in-flight").status_code == 201
    assert len(api.ledger.reservations) == 1


def test_upload_replay_makes_one_dataset(api: Api) -> None:
    _, token = api.tenant()
    data = b.zip_bytes(b.image_folder({"a": 3, "b": 3}))

    def upload(payload: bytes, key: str) -> Any:
        return api.client.post("/v1/datasets", headers={**auth(token), "Idempotency-Key": key},
                               files={"file": ("d.zip", payload, "application/zip")},
                               data={"metadata": json.dumps({"name": "pub",
                                                             "visibility": "public"})})

    first, again = upload(data, "up-1"), upload(data, "up-1")
    assert first.status_code == again.status_code == 201, first.text
    assert again.json()["dataset_id"] == first.json()["dataset_id"]
    assert again.headers["idempotent-replayed"] == "true"
    other = upload(b.zip_bytes(b.image_folder({"a": 4, "b": 3})), "up-1")
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    assert _count(api, "select count(*) from api.datasets") == 1


def test_expired_keys_are_purged(make_api: Any) -> None:
    api = make_api(idempotency_ttl_s=1)
    token, dataset, model = _setup(api)
    assert _submit(api, token, _spec(dataset, model), "old").status_code == 201
    assert _count(api, "select count(*) from api.idempotency_keys") == 1
    time.sleep(1.2)
    assert _submit(api, token, _spec(dataset, model), "new").status_code == 201
    assert _count(api, "select count(*) from api.idempotency_keys where key = 'old'") == 0
    # once expired, the key is new again: a replay runs (documented retention)
    again = _submit(api, token, _spec(dataset, model), "old")
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    assert len(api.ledger.reservations) == 3


def test_stored_responses_are_sealed_to_the_key_that_sent_them(api: Api) -> None:
    """A replayed key creation returns the same secret, which the table does not hold in
    clear; another key of the same tenant cannot replay (or read) it."""
    headers = {**auth(api.admin), "Idempotency-Key": "new-tenant"}
    body = {"name": "acme", "scopes": ["read", "submit", "owner"]}
    first = api.client.post("/v1/tenants", json=body, headers=headers)
    again = api.client.post("/v1/tenants", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    secret = first.json()["key"]["api_key"]
    engine = create_engine(api.settings.database.url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("select response_body from api.idempotency_keys "
                                       "where key = 'new-tenant'")).scalar_one()
    finally:
        engine.dispose()
    assert secret.encode() not in bytes(stored)
    tenant_id = first.json()["tenant_id"]
    r = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["submit"]},
                        headers=auth(api.admin))
    other_key = r.json()["api_key"]
    dataset, model = api.private_dataset(secret), api.model(secret)
    assert _submit(api, secret, _spec(dataset, model), "mine").status_code == 201
    r = _submit(api, other_key, _spec(dataset, model), "mine")
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    assert len(api.ledger.reservations) == 1


# --- the answer is stored before the client has it (a replay at once is a replay) ---

Headers = list[tuple[bytes, bytes]]


async def _asgi_post(app: Any, path: str, headers: Headers, body: bytes,
                     on_complete: Callable[[], Awaitable[None]] | None = None,
                     ) -> tuple[int, dict[str, str], bytes]:
    """POST through an ASGI app as a server would; ``on_complete`` runs the moment the
    client has the whole answer (the last body message), before the app returns."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "client": ("testclient", 50000),
             "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), *headers]}
    answer: dict[str, Any] = {"status": 0, "headers": {}, "chunks": []}
    read, done = False, anyio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {n.decode().lower(): v.decode()
                                 for n, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            answer["chunks"].append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()
                if on_complete is not None:
                    await on_complete()

    await app(scope, receive, send)
    return answer["status"], answer["headers"], b"".join(answer["chunks"])


def _replay_at_once(api: Api, token: str, key: str, body: bytes) -> list[Any]:
    """The first request, and a replay sent the moment the first answer is complete."""
    app = api.client.app
    headers: Headers = [(b"authorization", f"Bearer {token}".encode()),
                        (b"idempotency-key", key.encode())]
    answers: list[Any] = []

    async def replay() -> None:
        answers.append(await _asgi_post(app, "/v1/jobs", headers, body))

    async def first() -> None:
        answers.insert(0, await _asgi_post(app, "/v1/jobs", headers, body, replay))

    api.client.portal.call(first)  # type: ignore[union-attr]
    return answers


def test_a_replay_the_moment_the_answer_arrives_is_a_replay(api: Api) -> None:
    """Before the fix the answer went out before its row was stored: a client that replayed
    at once got 409 idempotency_in_progress for a request that had finished."""
    token, dataset, model = _setup(api)
    for i, spec in enumerate((_spec(dataset, model),
                              _spec(dataset, model) | {"training": {"expected_batch_size": 13,
                                                                    "epochs": 2}})):
        (status, headers, body), (rstatus, rheaders, rbody) = _replay_at_once(
            api, token, f"at-once-{i}", json.dumps(spec).encode())
        assert status == (201, 422)[i], body
        assert (rstatus, rbody) == (status, body), rbody
        assert rheaders.get("idempotent-replayed") == "true"
        assert "idempotent-replayed" not in headers
    assert _count(api, "select count(*) from api.jobs") == 1
    assert len(api.ledger.reservations) == 1


# --- what is not stored frees the key (the middleware around small ASGI apps) ---

def _store(api: Api) -> tuple[IdempotencyStore, Any]:
    engine = create_engine(api.settings.database.url)
    return IdempotencyStore(make_session_factory(engine), ttl_s=60, lock_timeout_s=60), engine


def _run(app: Any, api: Api, token: str, key: str) -> tuple[int, dict[str, str], bytes]:
    store, engine = _store(api)
    try:
        middleware = IdempotencyMiddleware(app, store)
        headers: Headers = [(b"authorization", f"Bearer {token}".encode()),
                            (b"idempotency-key", key.encode())]
        return anyio.run(_asgi_post, middleware, "/v1/things", headers, b"{}")
    finally:
        engine.dispose()


def _keys(api: Api) -> int:
    return _count(api, "select count(*) from api.idempotency_keys")


def test_a_large_answer_is_streamed_and_not_stored(api: Api) -> None:
    _, token = api.tenant()
    chunk = b"x" * (256 * 1024)

    async def large(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(8):  # 2 MiB: above the stored cap
            await send({"type": "http.response.body", "body": chunk, "more_body": i < 7})

    status, _, body = _run(large, api, token, "large")
    assert status == 200 and body == chunk * 8
    assert _keys(api) == 0  # freed: a retry runs again


def test_failures_free_the_key(api: Api) -> None:
    _, token = api.tenant()

    async def server_error(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"down"})

    async def raises_mid_answer(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        raise RuntimeError("boom")

    async def body_not_read(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    assert _run(server_error, api, token, "5xx")[0] == 503
    with pytest.raises(RuntimeError):
        _run(raises_mid_answer, api, token, "raises")
    status, _, body = _run(body_not_read, api, token, "unread")
    assert (status, body) == (200, b"{}")
    assert _keys(api) == 0


def test_a_store_that_fails_still_answers_and_frees_the_key(api: Api) -> None:
    _, token = api.tenant()

    async def created(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b'{"id": 1}'})

    class FailingFinish(IdempotencyStore):
        def finish(self, *args: Any, **kwargs: Any) -> None:
            raise OSError("database gone")

    store, engine = _store(api)
    try:
        failing = FailingFinish(store.sessions, ttl_s=60, lock_timeout_s=60)
        headers: Headers = [(b"authorization", f"Bearer {token}".encode()),
                            (b"idempotency-key", b"lost")]
        status, _, body = anyio.run(_asgi_post, IdempotencyMiddleware(created, failing),
                                    "/v1/things", headers, b"{}")
    finally:
        engine.dispose()
    assert (status, body) == (201, b'{"id": 1}')
    assert _keys(api) == 0
