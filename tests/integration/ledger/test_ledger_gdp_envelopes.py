"""``POST /v1/gdp-envelopes``: the Gaussian-DP envelope of a DP-SGD run, the claim a one-run
audit tests (issue 19). Against the ledger app on a real, migrated PostgreSQL database.

The answer is the accountant's own (``dp_sgd_gdp_envelope``), nothing is written, the
bounds and the computation's refusals are problem+json with stable codes, the work takes a
heavy slot (503 ``ledger_busy`` when none is free), and the worker's HTTP client reads the
same answer from the real app.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ledger.app import create_app
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.service import gdp_envelopes
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.plan_limits import PlanLimits
from dpsynth_worker.clients import LedgerClient
from fastapi.testclient import TestClient

from .conftest import AUTH, TOKEN, make_settings

PATH = "/v1/gdp-envelopes"
PROBLEM = "application/problem+json"
RUN = {"noise_multiplier": 1.0, "sample_rate": 0.05, "steps": 100}  # ~3 s, then cached


def _problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["code"] == code and body["status"] == status and body["instance"] == PATH
    return body


def test_the_envelope_is_the_accountants_and_writes_nothing(client: TestClient) -> None:
    r = client.post(PATH, json=RUN)
    assert r.status_code == 200, r.text
    body = r.json()
    expected = dp_sgd_gdp_envelope(1.0, 0.05, 100)
    assert body["mu"] == expected.mu and body["tail_delta"] == expected.tail_delta
    assert {k: body[k] for k in RUN} == RUN
    assert body["accountant"] == gdp_envelopes.ACCOUNTANT
    assert 0 < body["mu"] < 2 and 0 <= body["tail_delta"] <= 1e-9
    assert client.get("/v1/entries").json() == []  # stateless: no chained entry
    assert client.get("/v1/chain/verify").json()["ok"] is True


@pytest.mark.parametrize("bad", [{**RUN, "sample_rate": 0.0}, {**RUN, "steps": 0},
                                 {**RUN, "noise_multiplier": -1.0}, {**RUN, "sample_rate": 1.5},
                                 {"noise_multiplier": 1.0, "sample_rate": 0.05}])
def test_a_bad_body_is_the_ledgers_validation_problem(client: TestClient,
                                                      bad: dict[str, Any]) -> None:
    # the contract's bounds: refused before any accounting, as every ledger body is
    # (400 invalid_request, the ledger's RequestValidationError answer)
    body = _problem(client.post(PATH, json=bad), 400, "invalid_request")
    assert body["errors"]


def test_out_of_bounds_runs_are_refused_before_any_work(client: TestClient) -> None:
    limit = PlanLimits().max_steps
    body = _problem(client.post(PATH, json={**RUN, "steps": limit + 1}), 422,
                    "plan_too_large")
    assert (body["bound"], body["limit"], body["value"]) == ("max_steps", limit, limit + 1)
    body = _problem(client.post(PATH, json={**RUN, "noise_multiplier": 0.01}), 422,
                    "plan_too_large")
    assert body["bound"] == "min_noise_multiplier"
    assert body["limit"] == gdp_envelopes.MIN_NOISE_MULTIPLIER


def test_a_refused_computation_is_a_422_problem(client: TestClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # within the contract a run can still have no envelope (dp_sgd_gdp_envelope raises
    # ValueError "no GDP envelope below mu 1e4"; a real case costs ~45 s): a stable 422
    def refuse(noise_multiplier: float, sample_rate: float, steps: int) -> None:
        raise ValueError("no GDP envelope below mu 1e4")

    monkeypatch.setattr(gdp_envelopes, "dp_sgd_gdp_envelope", refuse)
    body = _problem(client.post(PATH, json=RUN), 422, "invalid_spec")
    assert "no GDP envelope" in body["detail"]


def test_the_service_token_is_required(client: TestClient) -> None:
    r = client.post(PATH, json=RUN, headers={"Authorization": "Bearer wrong-token"})
    _problem(r, 401, "unauthenticated")


def test_it_waits_for_a_heavy_slot(database_url: str) -> None:
    settings = make_settings(database_url, heavy_concurrency=1, heavy_wait_s=0.0)
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        with client.app.state.ctx.heavy.slot("the test"):  # type: ignore[attr-defined]
            r = client.post(PATH, json=RUN)
            _problem(r, 503, "ledger_busy")
            assert r.headers["retry-after"] == "2"
        assert client.post(PATH, json=RUN).status_code == 200


@pytest.fixture()
def worker_client(client: TestClient) -> Iterator[LedgerClient]:
    """The worker's LedgerClient, its requests forwarded to the real ledger app."""

    def forward(request: httpx.Request) -> httpx.Response:
        r = client.request(request.method, str(request.url.copy_with(
            scheme="http", host="testserver")), content=request.read(),
            headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    ledger = LedgerClient("http://ledger", TOKEN, transport=httpx.MockTransport(forward),
                          backoff_s=0.0)
    yield ledger
    ledger.close()


def test_the_workers_client_reads_the_same_envelope(client: TestClient,
                                                    worker_client: LedgerClient) -> None:
    answer = worker_client.gdp_envelope(**RUN)
    assert answer.model_dump() == client.post(PATH, json=RUN).json()
    expected = dp_sgd_gdp_envelope(1.0, 0.05, 100)
    assert (answer.mu, answer.tail_delta) == (expected.mu, expected.tail_delta)
    with pytest.raises(DpsynthError) as refused:
        worker_client.gdp_envelope(noise_multiplier=1.0, sample_rate=0.05,
                                   steps=PlanLimits().max_steps + 1)
    assert refused.value.code == ErrorCode.PLAN_TOO_LARGE
