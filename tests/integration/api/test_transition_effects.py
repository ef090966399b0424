"""The state table's declared effects over HTTP (issue 16, item 1): a job failed because its
task could not be sent releases its reservation, a ledger error while a cancel closes the
reservation changes nothing (the close runs under the row lock, before the commit), and a
worker's own terminal proposal is never closed a second time by the api."""

from __future__ import annotations

from typing import Any

import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.integration.api.conftest import Api, auth


def _setup(api: Api) -> tuple[str, str, str]:
    _, token = api.tenant()
    return token, api.private_dataset(token), api.model(token)


def test_a_refused_send_fails_the_job_and_releases_its_reservation(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    token, private, model = _setup(api)

    def refuse(job_id: str, attempt: int) -> None:
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(api.sender, "send_run_job", refuse)
    r = api.finetune(token, private, model)
    assert r.status_code == 503 and r.json()["code"] == "service_unavailable"
    job = api.client.get(f"/v1/jobs/{r.json()['job_id']}", headers=auth(token)).json()
    assert job["state"] == "failed" and job["error"]["code"] == "service_unavailable"
    assert api.ledger.closed == [(job["privacy"]["reservation_id"], "cancelled")]


def test_a_ledger_error_while_cancelling_leaves_the_job_queued(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    token, private, model = _setup(api)
    job_id = api.finetune(token, private, model).json()["job_id"]

    def unavailable(*_: Any) -> None:
        raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE, "the ledger is down")

    with monkeypatch.context() as patch:
        patch.setattr(api.ledger, "close_reservation", unavailable)
        r = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(token))
        assert r.json()["code"] == "ledger_unavailable"
    job = api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
    assert job["state"] == "queued" and api.ledger.closed == []
    again = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(token))
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    assert api.ledger.closed == [(job["privacy"]["reservation_id"], "cancelled")]


def test_a_workers_own_cancel_is_not_closed_again_by_the_api(api: Api) -> None:
    token, private, model = _setup(api)
    job_id = api.finetune(token, private, model).json()["job_id"]
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    api.client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(token))
    done = api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "cancelled"})
    assert done.status_code == 200 and done.json()["state"] == "cancelled"
    failed = api.finetune(token, private, model).json()["job_id"]
    assert api.worker(f"{failed}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    gone = api.worker(f"{failed}/transition", {"attempt": 1, "to_state": "failed",
                                               "error_code": "x", "message": "m"})
    assert gone.status_code == 200 and gone.json()["state"] == "failed"
    assert api.ledger.closed == []  # the worker closes its reservation itself
