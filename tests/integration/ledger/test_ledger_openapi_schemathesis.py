"""schemathesis over every operation of the ledger's OpenAPI document (issue 14, item 15).

The ledger runs as a real HTTP server (uvicorn, in a thread of the test process) on a real,
migrated PostgreSQL database, with two service tokens: the admin token (the api's) and a
worker's, which ``/v1/admin/*`` refuses with a 403. Each generated request is sent with both,
and every answer must be no server error and match the document (dpsynth_ledger.openapi):
its status, content type, body and headers.

A seeded budget, reservation, lease and evaluation replace about half of the generated path
ids, so the cases reach the routes' success answers and not only their 404s; the requests
random data seldom gets right are sent explicitly first. The size is bounded
(``MAX_EXAMPLES`` per operation, derandomized, no example database): the contract's safety
net in ``make test`` (docs/api-contract.md), not a fuzzing campaign.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from dpsynth_ledger.app import create_app
from dpsynth_ledger.migrate import upgrade
from hypothesis import HealthCheck, settings
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.ledger.conftest import TOKEN, make_settings
from tests.support.servers import serve_asgi

MAX_EXAMPLES = 10
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
WORKER_TOKEN = "ledger-worker-token-0123456789abcdef"
KEYS = {"admin": TOKEN, "worker": WORKER_TOKEN}
DATASET = "ds_seed"
LABELLED = "ds_labelled"


def _settings(database_url: str) -> Any:
    return make_settings(database_url, service_tokens=[SecretStr(TOKEN),
                                                       SecretStr(WORKER_TOKEN)],
                         admin_tokens=[SecretStr(TOKEN)])


def _document() -> dict[str, Any]:
    # The document needs no server or database: built at collection time, so each operation
    # is its own test; test_served_document_is_this_one checks the running ledger serves it.
    return create_app(_settings("postgresql+psycopg://unused@127.0.0.1/unused")).openapi()


DOCUMENT = _document()
schema = schemathesis.openapi.from_dict(DOCUMENT)


@dataclass
class Running:
    """The running ledger and the seeded ids by path parameter name."""

    url: str
    ids: dict[str, str]


def _created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _seed(client: httpx.Client) -> dict[str, str]:
    """A budget with a reservation, its read grant and a lease, an evaluation, and a
    labelled budget for the class-size release."""
    for dataset, partitions in ((DATASET, []), (LABELLED, ["a", "b"])):
        _created(client.post("/v1/budgets", json={
            "dataset_id": dataset, "tenant_id": "ten_seed", "epsilon_limit": 8.0,
            "delta": 1e-6, "declared_size": 60_000, "partitions": partitions}))
    reservation = _created(client.post("/v1/reservations", json={
        "job_id": "job_seed", "dataset_id": DATASET, "target_epsilon": 1.0,
        "expected_batch_size": 600, "steps": 200}))
    rid = str(reservation["reservation_id"])
    _created(client.post(f"/v1/reservations/{rid}/read-grants",
                         json={"attempt": 1, "worker_id": "w"}))
    lease = _created(client.post(f"/v1/reservations/{rid}/leases",
                                 json={"attempt": 1, "start_step": 0, "steps": 50}))
    evaluation = _created(client.post("/v1/evaluations", json={
        "dataset_id": DATASET, "job_id": "job_seed", "reference_dataset_id": "ds_reference",
        "requested_by": "key_owner"}))
    return {"dataset_id": DATASET, "reservation_id": rid, "lease_id": str(lease["lease_id"]),
            "evaluation_id": str(evaluation["evaluation_id"])}


@pytest.fixture(scope="module")
def running(pg: Any) -> Iterator[Running]:
    lset = _settings(pg.url(pg.create_database()))
    upgrade(lset)
    with serve_asgi(create_app(lset)) as url, httpx.Client(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield Running(url, _seed(client))


def _auth(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[role]}"}


def _seeded(path_parameters: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    # About half the generated ids are swapped for a seeded resource's (chosen from the
    # generated value, so the run stays deterministic): success answers are checked too.
    return {name: ids[name] if name in ids and zlib.crc32(str(value).encode()) % 2 == 0
            else value for name, value in path_parameters.items()}


def _success_cases(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any], int]]:
    """Requests that random data seldom gets right, with the status each must get."""
    dataset = {"dataset_id": DATASET}
    reservation = {"reservation_id": ids["reservation_id"]}
    plan = {"dataset_id": DATASET, "target_epsilon": 1.0, "expected_batch_size": 600,
            "steps": 100}
    return [
        ("/v1/size-release-plans", "POST", {"body": {
            "epsilon_limit": 1.0, "delta": 1e-6, "target_epsilon": 0.001}}, 200),
        ("/v1/budgets/{dataset_id}", "GET", {"path_parameters": dataset}, 200),
        ("/v1/budgets/{dataset_id}/histogram-releases", "POST",
         {"path_parameters": {"dataset_id": LABELLED},
          "body": {"target_epsilon": 0.5, "dry_run": True}}, 201),
        ("/v1/plans", "POST", {"body": plan}, 200),
        ("/v1/job-epsilon", "POST", {"body": {"dataset_id": DATASET,
                                                 "reservation_ids": [ids["reservation_id"]]}}, 200),
        ("/v1/gdp-envelopes", "POST", {"body": {
            "noise_multiplier": 1.0, "sample_rate": 0.05, "steps": 100}}, 200),
        ("/v1/reservations/{reservation_id}", "GET", {"path_parameters": reservation}, 200),
        ("/v1/datasets/{dataset_id}/evaluations", "GET", {"path_parameters": dataset}, 200),
        ("/v1/entries", "GET", {"query": {"dataset_id": DATASET}}, 200),
        ("/v1/chain/verify", "GET", {}, 200),
        ("/v1/chain/key", "GET", {}, 200),
        ("/v1/anchor", "GET", {}, 200),
        ("/v1/budgets/{dataset_id}/verify", "GET", {"path_parameters": dataset}, 200),
        ("/v1/budgets/{dataset_id}/recompute", "GET", {"path_parameters": dataset}, 200),
        ("/v1/budgets/{dataset_id}/limit", "POST",
         {"path_parameters": dataset, "body": {"warning_fraction": 0.5}}, 200),
    ]


def test_success_answers_match_the_document(running: Running) -> None:
    # First in the file: the generated cases that follow may close, extend or reconcile.
    seen = []
    for path, method, parts, status in _success_cases(running.ids):
        case = schema[path][method].Case(**parts)
        response = case.call(base_url=running.url, headers=_auth("admin"))
        case.validate_response(response, checks=CHECKS)
        seen.append((method, path, response.status_code))
    assert seen == [(m, p, s) for p, m, _, s in _success_cases(running.ids)]


def test_admin_operations_refuse_a_workers_token(running: Running) -> None:
    case = schema["/v1/admin/reconcile"]["POST"].Case(body={"api_jobs": []})
    response = case.call(base_url=running.url, headers=_auth("worker"))
    case.validate_response(response, checks=CHECKS)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_answer_matches_the_document(case: schemathesis.Case, running: Running) -> None:
    if case.path_parameters:
        case.path_parameters = _seeded(case.path_parameters, running.ids)
    for role in KEYS:
        # the heavy operations (a plan's or an accountant comparison's PLD calibration)
        # take seconds, up to ~15 s on a busy 2-core machine for few-step, large-ε inputs:
        # bounded by the bodies' ranges and the heavy slots, not by a 10 s client default
        response = case.call(base_url=running.url, headers=_auth(role), timeout=60)
        case.validate_response(response, checks=CHECKS)


def test_served_document_is_this_one(running: Running) -> None:
    served = httpx.get(f"{running.url}/openapi.json", timeout=30)
    assert served.status_code == 200
    assert served.json() == DOCUMENT
