"""Migrations up/down/up, autogenerate is empty; the chain verifies and detects tampering."""

from __future__ import annotations

import itertools

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from dpsynth_ledger.migrate import downgrade, upgrade
from dpsynth_ledger.models import SCHEMA, Base
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from .conftest import make_settings, new_budget


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names(schema=SCHEMA))
    finally:
        engine.dispose()


def test_migrations_up_down_up_and_autogenerate_is_empty(database_url: str) -> None:
    settings = make_settings(database_url)
    upgrade(settings)
    expected = {"budgets", "accumulators", "reservations", "reservation_parts", "leases",
                "entries", "chain_head", "evaluations", "calibrations", "tight_figures",
                "alembic_version"}
    assert _tables(database_url) == expected
    downgrade(settings, "base")
    assert _tables(database_url) == {"alembic_version"}
    upgrade(settings)
    assert _tables(database_url) == expected
    engine = create_engine(database_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "include_schemas": True, "version_table_schema": SCHEMA, "compare_type": True,
            "include_name": lambda name, type_, parents: type_ != "schema" or name == SCHEMA,
        })
        diff = compare_metadata(ctx, Base.metadata)
        head = conn.execute(text("SELECT seq, hash FROM ledger.chain_head")).one()
    engine.dispose()
    assert diff == []
    assert head == (0, "0" * 64)


def _sql(settings: LedgerSettings, statement: str) -> None:
    engine = create_engine(settings.database.url)
    try:
        with engine.begin() as conn:
            conn.execute(text(statement))
    finally:
        engine.dispose()


def _fill(client: TestClient) -> str:
    new_budget(client, "ds_chain", epsilon_limit=8.0)
    r = client.post("/v1/reservations", json={"job_id": "job_c1", "dataset_id": "ds_chain",
                                              "target_epsilon": 2.0, "expected_batch_size": 600,
                                              "steps": 300})
    assert r.status_code == 201, r.text
    rid = r.json()["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w"}).status_code == 201
    assert client.post(f"/v1/reservations/{rid}/leases",
                       json={"attempt": 1, "start_step": 0, "steps": 100}).status_code == 201
    return rid


def test_chain_verifies_and_detects_tampering(client: TestClient,
                                              settings: LedgerSettings) -> None:
    _fill(client)
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is True, report
    assert report["entries"] == 4
    entries = client.get("/v1/entries", params={"dataset_id": "ds_chain"}).json()
    assert [e["kind"] for e in entries] == ["budget_created", "reservation_accepted",
                                            "read_grant", "lease_granted"]
    assert entries[0]["prev_hash"] == "0" * 64
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(entries))
    assert report["head"] == entries[-1]["hash"]
    # the append-only trigger refuses UPDATE and DELETE, even to the superuser
    for statement in ("UPDATE ledger.entries SET kind = 'x' WHERE seq = 2",
                      "DELETE FROM ledger.entries WHERE seq = 2",
                      "TRUNCATE ledger.entries"):
        with pytest.raises(DBAPIError, match="append-only"):
            _sql(settings, statement)
    # a superuser who disables the trigger and lowers a charge is caught by verify
    _sql(settings, "ALTER TABLE ledger.entries DISABLE TRIGGER entries_append_only")
    _sql(settings, "UPDATE ledger.entries SET payload = jsonb_set(payload, '{steps}', '1') "
                   "WHERE kind = 'lease_granted'")
    _sql(settings, "ALTER TABLE ledger.entries ENABLE TRIGGER entries_append_only")
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    assert any("hash mismatch" in p for p in report["problems"]), report
    # the stored accumulator lowered behind the ledger's back is caught too
    _sql(settings, "UPDATE ledger.accumulators SET committed = 0")
    report = client.get("/v1/chain/verify").json()
    assert any("(stored)" in p for p in report["problems"]), report


def test_auth_and_problem_bodies(client: TestClient) -> None:
    r = client.get("/v1/budgets/nope", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "unauthenticated"
    r = client.get("/v1/budgets/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
