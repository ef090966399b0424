"""Tampering with one ledger entry in the database: verify fails and names the entry (issue 4).

Real PostgreSQL. The entries table is append-only through the ``entries_append_only`` and
``entries_no_truncate`` triggers (migration 0001); the tamperer here is the database owner, who
disables them for the edit and enables them again.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dpsynth_ledger.chain import entry_hash
from dpsynth_ledger.settings import LedgerSettings
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from .conftest import new_budget

DATASET = "ds_tamper"


def _tamper(settings: LedgerSettings, *statements: tuple[str, dict[str, Any]]) -> None:
    """Run ``statements`` with the append-only triggers disabled (as the owner), in one txn."""
    engine = create_engine(settings.database.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE ledger.entries DISABLE TRIGGER ALL"))
            for statement, params in statements:
                conn.execute(text(statement), params)
            conn.execute(text("ALTER TABLE ledger.entries ENABLE TRIGGER ALL"))
    finally:
        engine.dispose()


def _fill(client: TestClient) -> list[dict[str, Any]]:
    """A budget, a reservation, a read grant and two leases; returns the dataset's entries."""
    new_budget(client, DATASET, epsilon_limit=8.0)
    r = client.post("/v1/reservations", json={"job_id": "job_t1", "dataset_id": DATASET,
                                              "target_epsilon": 2.0, "expected_batch_size": 600,
                                              "steps": 300})
    assert r.status_code == 201, r.text
    rid = r.json()["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w"}).status_code == 201
    for start in (0, 100):
        r = client.post(f"/v1/reservations/{rid}/leases",
                        json={"attempt": 1, "start_step": start, "steps": 100})
        assert r.status_code == 201, r.text
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is True, report
    entries = client.get("/v1/entries", params={"dataset_id": DATASET}).json()
    assert [e["kind"] for e in entries] == ["budget_created", "reservation_accepted",
                                            "read_grant", "lease_granted", "lease_granted"]
    return entries


def _named(problems: list[str]) -> set[int]:
    """The entry sequence numbers the problems name (``entry N: ...``)."""
    return {int(m.group(1)) for p in problems if (m := re.match(r"entry (\d+)", p))}


def test_lowered_charge_in_a_lease_is_named(client: TestClient,
                                            settings: LedgerSettings) -> None:
    entries = _fill(client)
    lease = entries[3]
    seq = lease["seq"]
    charged = lease["payload"]["rdp_delta"]["*"]
    assert charged > 0
    _tamper(settings, (
        "UPDATE ledger.entries SET payload = jsonb_set(payload, '{rdp_delta,*}', "
        "to_jsonb(CAST(:amount AS double precision))) WHERE seq = :seq",
        {"amount": charged / 10, "seq": seq}))
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    # the edited entry is named for its altered content AND for its wrong charge
    assert f"entry {seq}: hash mismatch (content altered)" in problems, problems
    assert any(p.startswith(f"entry {seq}: charge ") for p in problems), problems
    # no other entry is blamed for a hash mismatch, and the first entry named is the edited one
    assert [p for p in problems if "hash mismatch" in p] == [
        f"entry {seq}: hash mismatch (content altered)"]
    assert min(_named(problems)) == seq
    # the triggers are back on: the table is append-only again
    assert client.get("/v1/chain/verify").json()["problems"] == problems


def test_rehashed_forgery_of_a_charge_is_still_named(client: TestClient,
                                                     settings: LedgerSettings) -> None:
    """A tamperer who lowers a charge AND recomputes every later hash and the head.

    The hash chain then links, so only the recomputation of the charge from the recorded
    DP event (and the replayed accumulators) can catch it; it must still name the entry.
    """
    entries = _fill(client)
    seq = entries[3]["seq"]
    engine = create_engine(settings.database.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT seq, dataset_id, kind, payload, prev_hash FROM ledger.entries "
                "ORDER BY seq")).all()
    finally:
        engine.dispose()
    statements: list[tuple[str, dict[str, Any]]] = []
    prev = None
    for row in rows:
        payload = dict(row.payload)
        if row.seq == seq:
            payload["rdp_delta"] = {p: v / 10 for p, v in payload["rdp_delta"].items()}
        if row.seq < seq:
            continue
        prev = row.prev_hash if prev is None else prev
        digest = entry_hash(prev, seq=row.seq, dataset_id=row.dataset_id, kind=row.kind,
                            payload=payload)
        statements.append(("UPDATE ledger.entries SET payload = CAST(:payload AS jsonb), "
                           "prev_hash = :prev, hash = :hash WHERE seq = :seq",
                           {"payload": json.dumps(payload), "prev": prev, "hash": digest,
                            "seq": row.seq}))
        prev = digest
    statements.append(("UPDATE ledger.chain_head SET hash = :hash", {"hash": prev}))
    _tamper(settings, *statements)
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    assert not [p for p in problems if "hash mismatch" in p or "link" in p], problems
    assert any(p.startswith(f"entry {seq}: charge ") for p in problems), problems
    assert min(_named(problems)) == seq


def test_deleted_entry_is_named(client: TestClient, settings: LedgerSettings) -> None:
    entries = _fill(client)
    gone = entries[2]["seq"]  # the read grant, between the reservation and the first lease
    _tamper(settings, ("DELETE FROM ledger.entries WHERE seq = :seq", {"seq": gone}))
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    assert report["entries"] == len(entries) - 1
    assert f"entry {gone}: missing (deleted from the chain)" in problems, problems
    assert f"entry {gone + 1}: prev_hash does not link to entry before it" in problems


def test_deleted_last_entry_is_named(client: TestClient, settings: LedgerSettings) -> None:
    """Deleting the newest entry leaves a chain that links; the head still names it."""
    entries = _fill(client)
    last = entries[-1]["seq"]
    _tamper(settings, ("DELETE FROM ledger.entries WHERE seq = :seq", {"seq": last}))
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    assert f"entry {last}: missing (the chain head is at entry {last})" in problems, problems
    # the replayed accumulators no longer match the stored ones (the lease's charge is gone)
    assert any("(stored)" in p for p in problems), problems
