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


def test_a_reservation_whose_answer_was_lost_is_sent_again_with_the_same_job_id() -> None:
    from dpsynth_shared.dp_events import DpSgdEvent
    from dpsynth_shared.ledger_contract import Reservation, ReservationState

    made = Reservation(reservation_id="res_1", job_id="job_x", dataset_id="ds_x",
                       state=ReservationState.OPEN,
                       event=DpSgdEvent(noise_multiplier=1.2, sample_rate=0.1, steps=6),
                       expected_batch_size=4, steps_reserved=6, steps_granted=0,
                       current_attempt=0, job_epsilon=4.9, job_epsilon_granted=0.0)
    bodies: list[dict] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            raise httpx.ReadTimeout("the ledger was slow", request=request)
        return httpx.Response(200, json=made.model_dump(mode="json"))

    assert _ledger(flaky).reserve(REQUEST).reservation_id == "res_1"
    assert len(bodies) == 2 and bodies[0] == bodies[1]  # same job_id: idempotent at the ledger

    calls: list[int] = []

    def always_down(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("down", request=request)

    with pytest.raises(DpsynthError) as info:
        _ledger(always_down).reserve(REQUEST)
    assert info.value.code == ErrorCode.LEDGER_UNAVAILABLE and len(calls) == 3


def test_a_refusal_is_not_retried() -> None:
    calls: list[int] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(409, json={"type": "x", "title": "t", "status": 409,
                                         "detail": "no", "code": "privacy_budget_exhausted"})

    with pytest.raises(DpsynthError):
        _ledger(refuse).reserve(REQUEST)
    assert calls == [1]
