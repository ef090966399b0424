"""The HTTP adapters over an in-process fake server (httpx.MockTransport): bearer tokens,
problem+json back into DpsynthError, retries only where a retry cannot double a charge."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_worker.clients import ApiClient, LedgerClient

Handler = Callable[[httpx.Request], httpx.Response]


def _problem(status: int, code: str, **ext: object) -> httpx.Response:
    body = {"type": "about:blank", "title": code, "status": status, "code": code,
            "detail": "d", **ext}
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


class Server:
    """Answers from a list of handlers, one per request, and records requests."""

    def __init__(self, *answers: Handler | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(request)


def _ledger(server: Server) -> LedgerClient:
    return LedgerClient("http://ledger/", "tok-ledger", transport=httpx.MockTransport(server),
                        backoff_s=0.0)


def test_problem_json_becomes_the_same_domain_error() -> None:
    server = Server(lambda r: _problem(409, "privacy_budget_exhausted",
                                       max_admissible_target_epsilon=0.5))
    with pytest.raises(DpsynthError) as info:
        _ledger(server).extend("res_1", attempt=2, additional_steps=3)
    assert info.value.code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED
    assert info.value.extensions["max_admissible_target_epsilon"] == 0.5
    (request,) = server.requests
    assert request.url.path == "/v1/reservations/res_1/extend"
    assert request.headers["authorization"] == "Bearer tok-ledger"
    assert json.loads(request.content) == {"attempt": 2, "additional_steps": 3}


def test_claim_refused_reaches_the_caller() -> None:
    server = Server(lambda r: _problem(409, "claim_refused"))
    api = ApiClient("http://api", "tok-api", transport=httpx.MockTransport(server),
                    backoff_s=0.0)
    with pytest.raises(DpsynthError) as info:
        api.claim("job_1", attempt=4, worker_id="w")
    assert info.value.code == ErrorCode.CLAIM_REFUSED
    assert json.loads(server.requests[0].content) == {"attempt": 4, "worker_id": "w"}


def test_writes_retry_connection_failures_and_unavailable_answers() -> None:
    ok = {"job_epsilon": 1.25, "delta": 1e-6}
    server = Server(httpx.ConnectError("refused"), lambda r: httpx.Response(503),
                    lambda r: httpx.Response(200, json=ok))
    answer = _ledger(server).job_epsilon(dataset_id="ds_1", reservation_ids=["res_1"])
    assert (answer.job_epsilon, answer.delta) == (1.25, 1e-6)
    assert len(server.requests) == 3


def test_a_lease_is_not_retried_after_a_read_timeout() -> None:
    server = Server(httpx.ReadTimeout("slow"), lambda r: httpx.Response(500))
    with pytest.raises(DpsynthError) as info:
        _ledger(server).lease("res_1", attempt=1, start_step=0, steps=5)
    assert info.value.code == ErrorCode.LEDGER_UNAVAILABLE
    assert len(server.requests) == 1  # the request may have been charged: never sent twice


def test_reads_retry_then_give_up_as_unavailable() -> None:
    server = Server(*[httpx.ReadTimeout("slow")] * 4)
    with pytest.raises(DpsynthError) as info:
        _ledger(server).budget_view("ds_1")
    assert info.value.code == ErrorCode.LEDGER_UNAVAILABLE
    assert len(server.requests) == 4
