"""Only the api's service token may call the ledger's ``/v1/admin/*`` (issue 14, item 6).

Reconciliation acts on every tenant's budgets at once; with ``DPSYNTH_LEDGER_ADMIN_TOKENS``
set (every shipped deployment sets it to the api's ledger token), a worker's token is
refused there with 403 ``forbidden`` and audited, while it keeps every other operation.
"""

from __future__ import annotations

import logging

import pytest
from dpsynth_ledger.app import create_app
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError

from tests.integration.ledger.conftest import TOKEN, make_settings

WORKER = "ledger-worker-token-0123456789abcdef"


def test_a_worker_token_cannot_reconcile(database_url: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings(database_url, service_tokens=[SecretStr(TOKEN), SecretStr(WORKER)],
                             admin_tokens=[SecretStr(TOKEN)])
    upgrade(settings)
    with TestClient(create_app(settings)) as c, caplog.at_level(logging.INFO):
        worker = {"Authorization": f"Bearer {WORKER}"}
        api = {"Authorization": f"Bearer {TOKEN}"}
        refused = c.post("/v1/admin/reconcile", json={"api_jobs": []}, headers=worker)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        assert c.get("/v1/chain/verify", headers=worker).status_code == 200  # not an admin path
        ok = c.post("/v1/admin/reconcile", json={"api_jobs": []}, headers=api)
        assert ok.status_code == 200, ok.text
    audits = [r for r in caplog.records if r.name == "dpsynth_ledger.audit"]
    assert [(r.service_token_index, r.outcome) for r in audits] == [(1, "forbidden"), (0, "ok")]
    assert all(WORKER not in r.getMessage() and TOKEN not in r.getMessage() for r in audits)


def test_admin_tokens_must_be_service_tokens(database_url: str) -> None:
    with pytest.raises(ValidationError, match="ADMIN_TOKENS"):
        LedgerSettings(**{**make_settings(database_url).model_dump(),
                          "admin_tokens": [SecretStr(WORKER)]})
