"""The api's admin reconcile endpoint: it sends every DP job the api knows to the ledger.

Real PostgreSQL for the api; the ledger is the in-memory fake (the real ledger's side is in
tests/integration/ledger/test_ledger_anchor.py and tests/e2e/test_restore.py).
"""

from __future__ import annotations

from tests.integration.api.conftest import Api, auth


def test_reconcile_sends_the_apis_dp_jobs_and_needs_admin(api: Api) -> None:
    _, token = api.tenant()
    dataset_id = api.private_dataset(token, n=30)
    model_id = api.model(token)
    r = api.finetune(token, dataset_id, model_id)
    assert r.status_code == 201, r.text
    job = r.json()
    assert api.client.post("/v1/admin/ledger/reconcile",
                           headers=auth(token)).status_code == 403
    r = api.client.post("/v1/admin/ledger/reconcile", headers=auth(api.admin))
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True
    (request,) = api.ledger.reconciled
    (record,) = request.api_jobs
    privacy = job["privacy"]
    assert record.job_id == job["job_id"]
    assert record.dataset_id == dataset_id  # an original upload is its own budget
    assert record.reservation_id == privacy["reservation_id"]
    assert record.noise_multiplier == privacy["noise_multiplier"]
    assert record.sample_rate == privacy["sample_rate"]
    assert record.steps == privacy["steps"] and record.steps
    status = api.client.get("/v1/admin/ledger/anchor", headers=auth(api.admin))
    assert status.status_code == 200 and status.json()["behind"] is False
    assert api.client.get("/v1/admin/ledger/anchor", headers=auth(token)).status_code == 403
