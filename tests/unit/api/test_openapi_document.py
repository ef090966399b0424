"""The api's OpenAPI document declares the errors every operation can answer (issue 14,
item 15): problem+json bodies for validation, authentication and rate limiting, the
``Idempotency-Key`` header on POSTs, and no JSON placeholder on file downloads.

The document is built from an app on unused settings and fake ports (no server, no database);
tests/integration/api/test_openapi_schemathesis.py checks it against real answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dpsynth_api.app import create_app
from dpsynth_api.fakes import FakeLedger, RecordingSender
from dpsynth_api.openapi import DOMAIN_STATUSES
from dpsynth_shared.stores.local import LocalDirStore

from tests.integration.api.conftest import make_settings

PROBLEM = "application/problem+json"
# The only operations that take no key: probes, the presigned URL (its token is the key) and
# the dashboard's page and static files (its script sends the key the user types).
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/presigned/{token}"),
          ("GET", "/dashboard"), ("GET", "/dashboard/static/{name}")}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    tmp = Path("/nonexistent/dpsynth-openapi")
    app = create_app(make_settings("postgresql+psycopg://unused@127.0.0.1/unused", tmp),
                     store=LocalDirStore(tmp), ledger=FakeLedger(),
                     task_sender=RecordingSender())
    return app.openapi()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, ops in document["paths"].items()
            for method, op in ops.items()]


def _is_problem(response: dict[str, Any]) -> bool:
    content = response.get("content", {})
    return list(content) == [PROBLEM] and content[PROBLEM]["schema"] == {
        "$ref": "#/components/schemas/Problem"}


def test_every_operation_declares_its_errors_as_problems(document: dict[str, Any]) -> None:
    operations = _operations(document)
    assert len(operations) >= 35
    missing = []
    for method, path, op in operations:
        expected = {"400", "422"}
        if (method, path) not in PUBLIC:
            expected |= {"401", "403"} if not path.startswith("/internal/") else {"401"}
        if path.startswith("/v1/"):
            expected.add("429")
        missing += [f"{method} {path} {status}" for status in sorted(expected)
                    if not _is_problem(op["responses"].get(status, {}))]
        # every error it declares is a problem, never FastAPI's application/json default
        missing += [f"{method} {path} {status} not problem+json"
                    for status, response in op["responses"].items()
                    if int(status) >= 400 and not _is_problem(response)]
    assert missing == []


def test_authenticated_operations_name_their_scheme(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes["apiKey"]["scheme"] == "bearer"
    for method, path, op in _operations(document):
        if (method, path) in PUBLIC:
            assert "security" not in op, (method, path)
        else:
            expected = "workerToken" if path.startswith("/internal/") else "apiKey"
            assert op["security"] == [{expected: []}], (method, path)
        if "429" in op["responses"]:
            assert "Retry-After" in op["responses"]["429"]["headers"], (method, path)


def test_posts_take_an_idempotency_key(document: dict[str, Any]) -> None:
    for method, path, op in _operations(document):
        names = [p["name"] for p in op.get("parameters", [])]
        takes = method == "POST" and path.startswith("/v1/")
        assert ("Idempotency-Key" in names) is takes, (method, path)
        if takes:
            assert _is_problem(op["responses"]["409"]), (method, path)


def test_downloads_and_dual_answers_are_declared(document: dict[str, Any]) -> None:
    paths = document["paths"]
    zip_200 = paths["/v1/models/{model_id}/download"]["get"]["responses"]["200"]["content"]
    assert list(zip_200) == ["application/zip"]
    presigned = paths["/v1/presigned/{token}"]["get"]["responses"]["200"]["content"]
    assert list(presigned) == ["application/octet-stream"]
    artifact = paths["/v1/artifacts/{artifact_id}/download"]["get"]["responses"]["200"]
    assert artifact["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Presigned"}
    assert list(paths["/dashboard"]["get"]["responses"]["200"]["content"]) == ["text/html"]
    jobs = paths["/v1/jobs"]["post"]["responses"]
    assert jobs["201"]["content"]["application/json"]["schema"]["$ref"].endswith("/JobOut")
    # 200: a dry run's plan, or an identical pretraining reused (issue 18, item 5)
    refs = {alt["$ref"].rsplit("/", 1)[-1]
            for alt in jobs["200"]["content"]["application/json"]["schema"]["anyOf"]}
    assert refs == {"DryRun", "JobOut"}


def test_domain_statuses_name_real_operations(document: dict[str, Any]) -> None:
    known = {(method, path) for method, path, _ in _operations(document)}
    assert set(DOMAIN_STATUSES) - known == set()
    assert "HTTPValidationError" not in document["components"]["schemas"]
