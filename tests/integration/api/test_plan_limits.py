"""The attack plan of issue 14, item 1, through the api: refused at submission.

A dry-run finetune with batch 1 and 10,000 epochs on a large declared size once kept the
ledger busy for minutes. The api checks the ledger's plan bounds (its setting
``plan_limits``, kept equal to the ledger's) before asking the ledger; the ledger checks them
again (tests/integration/ledger/test_ledger_heavy.py).
"""

from __future__ import annotations

import time
from typing import Any

from tests.integration.api.conftest import Api, auth
from tests.unit.api import builders as b


def _private(api: Api, token: str, declared_size: int, size: int) -> str:
    r = api.upload(token, b.digits_npz(12, k=3, size=size), {
        "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
        "label_domain": ["x", "y", "z"], "declared_size": declared_size}, filename="d.npz")
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def _spec(dataset: str, model: str, *, batch: int, epochs: int) -> dict[str, Any]:
    return {"type": "finetune", "dataset_id": dataset, "base_model_id": model,
            "privacy": {"target_epsilon": 1.0},
            "training": {"expected_batch_size": batch, "epochs": epochs}}


def test_the_attack_plan_is_refused_before_the_ledger_is_asked(real_ledger_api: Api) -> None:
    api = real_ledger_api
    _tenant, owner = api.tenant("owner")
    dataset = _private(api, owner, 100_000_000, size=9)
    model = api.model(owner)
    started = time.monotonic()
    r = api.client.post("/v1/jobs?dry_run=true", headers=auth(owner),
                        json=_spec(dataset, model, batch=1, epochs=10_000))
    assert time.monotonic() - started < 1.0
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "plan_too_large" and body["bound"] == "max_steps"
    assert body["value"] == 10**12 and body["limit"] == api.settings.plan_limits.max_steps
    # a paper-sized job stays admissible (DP-LDM: 200 epochs at batch 2,000 of 60,000)
    small = _private(api, owner, 60_000, size=10)
    ok = api.client.post("/v1/jobs?dry_run=true", headers=auth(owner),
                         json=_spec(small, model, batch=2_000, epochs=200))
    assert ok.status_code == 200, ok.text
