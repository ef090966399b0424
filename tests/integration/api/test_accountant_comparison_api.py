"""``POST /v1/accountant-comparisons`` through the api and the real ledger over HTTP
(issue 20, item 4): the report of a planned job, authenticated, stateless, bounded, with
problem+json errors, and described by the api's OpenAPI document."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, auth

PATH = "/v1/accountant-comparisons"
BODY = {"target_epsilon": 2.0, "delta": 1e-5, "sample_rate": 0.02, "steps": 300}


def test_the_report_comes_from_the_real_ledger(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _, token = api.tenant()
    r = api.client.post(PATH, json=BODY, headers=auth(token))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    rows = {row["accountant"]: row for row in body["rows"]}
    assert set(rows) == {"rdp", "gdp", "pld"}
    assert body["ledger_calibrates_with"] == "pld"
    assert body["ledger_noise_multiplier"] == rows["pld"]["noise_multiplier"]
    assert rows["rdp"]["noise_multiplier"] >= rows["pld"]["noise_multiplier"]
    assert rows["gdp"]["is_upper_bound"] is False
    for name, row in rows.items():
        assert abs(row["epsilon_by"][name] - 2.0) < 0.01
    # unauthenticated: the api's problem+json, the ledger never asked
    r = api.client.post(PATH, json=BODY)
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    assert r.headers["content-type"].startswith("application/problem+json")
    # out of range: refused by the shared contract before any computation
    for bad in ({**BODY, "steps": 0}, {**BODY, "delta": 0.5}, {**BODY, "target_epsilon": 90},
                {**BODY, "steps": 10**8}, {**BODY, "extra": 1}):
        r = api.client.post(PATH, json=bad, headers=auth(token))
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["code"] == "invalid_request"
    # a target no sigma <= 1e4 reaches: the ledger's invalid_spec, passed on
    r = api.client.post(PATH, json={"target_epsilon": 0.05, "delta": 1e-12, "sample_rate": 1.0,
                                    "steps": 100_000}, headers=auth(token))
    assert r.status_code == 422 and r.json()["code"] == "invalid_spec", r.text


def test_the_openapi_document_describes_it(api: Api) -> None:
    document = api.client.get("/openapi.json").json()
    op = document["paths"][PATH]["post"]
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/AccountantComparison"}
    assert "AccountantComparisonRequest" in str(op["requestBody"])
    assert "401" in op["responses"]
