"""The ledger's OpenAPI document declares the errors every operation can answer (issue 14,
item 15): problem+json bodies for validation, the service token, the admin operations, path
ids and a busy or anchor-behind ledger, and nothing the router declared blindly.

The document is built from an app on unused settings (no server, no database);
tests/integration/ledger/test_ledger_openapi_schemathesis.py checks it against real answers.
"""

from __future__ import annotations

from typing import Any

import pytest
from dpsynth_ledger.app import create_app
from dpsynth_ledger.openapi import DOMAIN_STATUSES

from tests.integration.ledger.conftest import make_settings

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(make_settings("postgresql+psycopg://unused@127.0.0.1/unused")).openapi()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, ops in document["paths"].items()
            for method, op in ops.items()]


def _is_problem(response: dict[str, Any]) -> bool:
    content = response.get("content", {})
    return list(content) == [PROBLEM] and content[PROBLEM]["schema"] == {
        "$ref": "#/components/schemas/Problem"}


def test_every_operation_declares_its_errors_as_problems(document: dict[str, Any]) -> None:
    operations = _operations(document)
    assert len(operations) >= 26
    missing = []
    for method, path, op in operations:
        expected = {"400", "401", "422", "503"}
        if "{" in path:
            expected.add("404")
        if path.startswith("/v1/admin/"):
            expected.add("403")
        missing += [f"{method} {path} {status}" for status in sorted(expected)
                    if not _is_problem(op["responses"].get(status, {}))]
        # every error it declares is a problem, never FastAPI's application/json default
        missing += [f"{method} {path} {status} not problem+json"
                    for status, response in op["responses"].items()
                    if int(status) >= 400 and not _is_problem(response)]
        assert op["security"] == [{"serviceToken": []}], (method, path)
        assert "Retry-After" in op["responses"]["503"]["headers"], (method, path)
    assert missing == []


def test_the_routers_blanket_statuses_are_gone(document: dict[str, Any]) -> None:
    # The router declared 404 and 409 on every route; a GET without a path id answers neither.
    entries = document["paths"]["/v1/entries"]["get"]["responses"]
    assert "404" not in entries and "409" not in entries
    assert "403" not in document["paths"]["/v1/budgets/{dataset_id}"]["get"]["responses"]


def test_the_known_domain_statuses_are_declared(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert "409" in paths["/v1/budgets"]["post"]["responses"]  # the budget exists already
    assert "404" in paths["/v1/job-epsilon"]["post"]["responses"]  # an unknown reservation
    # stateless: no path id, no conflict; its bounds are 422s, a busy ledger a 503
    envelope = paths["/v1/gdp-envelopes"]["post"]["responses"]
    assert {"200", "400", "401", "422", "503"} <= set(envelope)
    assert "404" not in envelope and "409" not in envelope


def test_domain_statuses_name_real_operations(document: dict[str, Any]) -> None:
    known = {(method, path) for method, path, _ in _operations(document)}
    assert set(DOMAIN_STATUSES) - known == set()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "Problem" in schemas
