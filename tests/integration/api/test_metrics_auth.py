"""Issue 14, item 11: the api's /metrics asks for the metrics token when one is set (the
ledger's side, and its per-dataset gauges, are in tests/integration/ledger/
test_ledger_metrics.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.api.conftest import WORKER_TOKEN, Api, auth, make_settings

METRICS_TOKEN = "api-metrics-token-0123456789abcdef"


def test_api_metrics_need_the_metrics_token(make_api: Callable[..., Api]) -> None:
    api = make_api(metrics_token=METRICS_TOKEN)
    for headers in ({}, auth(api.admin), {"Authorization": f"Bearer {WORKER_TOKEN}"},
                    {"Authorization": "Bearer not-the-metrics-token"}):
        r = api.client.get("/metrics", headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "unauthenticated"
        assert "dpsynth_api" not in r.text
    ok = api.client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert ok.status_code == 200, ok.text
    assert "dpsynth_api_jobs" in ok.text


def test_a_weak_metrics_token_is_refused_at_start(database_url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="DPSYNTH_API_METRICS_TOKEN"):
        make_settings(database_url, tmp_path, metrics_token="changeme")
