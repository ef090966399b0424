"""Fixtures of the ledger's integration tests: settings on a fresh real database, a client."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpsynth_ledger.app import create_app
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.settings import AnchorSettings, LedgerSettings
from dpsynth_shared.grants import generate_signing_key
from dpsynth_shared.settings import DatabaseSettings
from fastapi.testclient import TestClient
from pydantic import SecretStr

TOKEN = "ledger-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_settings(database_url: str, **overrides: object) -> LedgerSettings:
    """Ledger settings for a test database (fresh grant and chain keys each time, and an
    anchor file of its own in a fresh temporary folder)."""
    anchor = Path(tempfile.mkdtemp(prefix="ledger-anchor-")) / "anchor.jsonl"
    values: dict[str, object] = {
        "database": DatabaseSettings(url=database_url),
        "service_tokens": [SecretStr(TOKEN)],
        "grant_signing_key": SecretStr(generate_signing_key()),
        "chain_signing_key": SecretStr(generate_signing_key()),
        "anchor": AnchorSettings(path=str(anchor)),
        "lease_ttl_s": 60,
        # views compute a missing tight figure themselves, so tests read it at once (the
        # background worker is tested with it off: test_ledger_heavy.py)
        "tight_inline": True,
    }
    values.update(overrides)
    return LedgerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture()
def settings(database_url: str) -> LedgerSettings:
    s = make_settings(database_url)
    upgrade(s)
    return s


@pytest.fixture()
def client(settings: LedgerSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=AUTH) as c:
        yield c


def new_budget(client: TestClient, dataset_id: str, *, epsilon_limit: float = 8.0,
               delta: float = 1e-6, declared_size: int = 60_000,
               partitions: list[str] | None = None) -> dict:
    """POST /v1/budgets and return the BudgetView."""
    r = client.post("/v1/budgets", json={
        "dataset_id": dataset_id, "tenant_id": "ten_test", "epsilon_limit": epsilon_limit,
        "delta": delta, "declared_size": declared_size, "partitions": partitions or []})
    assert r.status_code == 201, r.text
    return r.json()
