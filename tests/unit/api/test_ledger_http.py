"""The ledger adapter turns the ledger's problem+json back into the same DpsynthError."""

from __future__ import annotations

import json

import httpx
import pytest
from dpsynth_api.adapters.ledger_http import HttpLedger
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import ReserveRequest

REQUEST = ReserveRequest(job_id="job_x", dataset_id="ds_x", target_epsilon=5.0,
                         expected_batch_size=4, steps=6)


def _ledger(handler: object) -> HttpLedger:
    return HttpLedger("http://ledger", "t" * 20,
                      transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def test_a_409_comes_back_with_its_numbers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(409, headers={"content-type": "application/problem+json"},
                              json={"type": "x", "title": "t", "status": 409, "detail": "no",
                                    "code": "privacy_budget_exhausted",
                                    "max_admissible_target_epsilon": 1.25})

    with pytest.raises(DpsynthError) as info:
        _ledger(handler).reserve(REQUEST)
    assert info.value.code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED
    assert info.value.extensions["max_admissible_target_epsilon"] == 1.25
    assert seen[0].url.path == "/v1/reservations"
    assert seen[0].headers["authorization"] == "Bearer " + "t" * 20
    assert json.loads(seen[0].content)["dry_run"] is False


def test_unreachable_or_garbled_ledger_is_unavailable() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(DpsynthError) as info:
        _ledger(down).get_budget("ds_x")
    assert info.value.code == ErrorCode.LEDGER_UNAVAILABLE
    assert _ledger(down).ready() is False
    with pytest.raises(DpsynthError) as info:
        _ledger(lambda r: httpx.Response(502, text="bad gateway")).get_budget("ds_x")
    assert info.value.code == ErrorCode.LEDGER_UNAVAILABLE
