"""``Idempotency-Key`` on creating POSTs (issue 14, item 8), on a real PostgreSQL.

A replay returns the first response and does not do the work again (one job, one
reservation, one dataset); another body under the same key is a 422; tenants' keys are
independent; concurrent duplicates create once; expired keys are purged.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dpsynth_api.db import make_session_factory
from dpsynth_api.idempotency import IdempotencyStore
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
