"""Signed entries and the append-only anchor (issue 4, item 4), on real PostgreSQL.

Every entry is signed with the chain key and written to the anchor file before its commit;
verify checks every signature and compares the anchor with the database. A database restored
from a backup is behind its anchor: ``/readyz`` and every admission answer 503
``ledger_behind_anchor`` until reconciliation re-charges what the backup lacks.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpsynth_ledger.app import create_app
from dpsynth_ledger.chain import entry_hash
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.grants import generate_signing_key, key_id_of, sign_message, verify_message
from dpsynth_shared.ledger_contract import signed_message
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from .conftest import AUTH, new_budget

DATASET = "ds_anchor"


def _anchor(settings: LedgerSettings) -> Path:
    return Path(settings.anchor.path)


def _lines(settings: LedgerSettings) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _anchor(settings).read_text().splitlines() if line]


def _db_entries(settings: LedgerSettings) -> list[dict[str, Any]]:
    engine = create_engine(settings.database.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT seq, hash, signature, key_id FROM ledger.entries "
                                     "ORDER BY seq")).mappings().all()
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


def _tamper(settings: LedgerSettings, statement: str, params: dict[str, Any]) -> None:
    """Edit ``ledger.entries`` as the database owner (append-only triggers off for it)."""
    engine = create_engine(settings.database.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE ledger.entries DISABLE TRIGGER ALL"))
            conn.execute(text(statement), params)
            conn.execute(text("ALTER TABLE ledger.entries ENABLE TRIGGER ALL"))
    finally:
        engine.dispose()


def _reserve(client: TestClient, job_id: str, dataset_id: str = DATASET,
             target: float = 1.0, steps: int = 200) -> Any:
    return client.post("/v1/reservations", json={
        "job_id": job_id, "dataset_id": dataset_id, "target_epsilon": target,
        "expected_batch_size": 600, "steps": steps})


def _run_job(client: TestClient, job_id: str, *, leases: int = 2,
             dataset_id: str = DATASET) -> str:
    """Reserve, touch and charge ``leases`` leases of 50 steps; returns the reservation id."""
    r = _reserve(client, job_id, dataset_id)
    assert r.status_code == 201, r.text
    rid = str(r.json()["reservation_id"])
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": 1, "worker_id": "w"}).status_code == 201
    for i in range(leases):
        r = client.post(f"/v1/reservations/{rid}/leases",
                        json={"attempt": 1, "start_step": 50 * i, "steps": 50})
        assert r.status_code == 201, r.text
    return rid


def _spent(client: TestClient, dataset_id: str = DATASET) -> float:
    r = client.get(f"/v1/budgets/{dataset_id}", params={"history": False})
    assert r.status_code == 200, r.text
    return float(r.json()["dataset_epsilon_spent"])


def test_entries_are_signed_anchored_and_verify(client: TestClient,
                                                settings: LedgerSettings) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    _run_job(client, "job_a1")
    rows = _db_entries(settings)
    public = settings.chain_public_key
    assert rows and all(r["key_id"] == key_id_of(public) for r in rows)
    # independently of the ledger's code: each signature covers (seq, hash)
    assert all(verify_message(signed_message(r["seq"], r["hash"]), r["signature"], public)
               for r in rows)
    # the grant key signs grants, never the chain
    assert not verify_message(signed_message(rows[0]["seq"], rows[0]["hash"]),
                              rows[0]["signature"], settings.grant_public_key)
    lines = _lines(settings)
    assert [(x["type"], x["seq"], x["hash"], x["signature"]) for x in lines] == \
        [("entry", r["seq"], r["hash"], r["signature"]) for r in rows]
    for x in lines:  # each anchored line carries the full entry: its content hashes to it
        assert entry_hash(x["prev_hash"], seq=x["seq"], dataset_id=x["dataset_id"],
                          kind=x["kind"], payload=x["payload"]) == x["hash"]
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is True, report["problems"]
    assert report["signatures_checked"] == len(rows) == report["entries"]
    anchor = report["anchor"]
    assert anchor["anchored_seq"] == anchor["local_seq"] == rows[-1]["seq"]
    assert anchor["behind"] is False and anchor["diverged"] is False
    assert anchor["location"] == str(_anchor(settings)) and anchor["public_key"] == public
    assert client.get("/v1/anchor").json() == anchor
    assert client.get("/readyz").status_code == 200


def test_a_forged_or_missing_signature_is_named(client: TestClient,
                                                settings: LedgerSettings) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    _run_job(client, "job_f1")
    rows = _db_entries(settings)
    forged, unsigned = rows[2], rows[3]
    other_key = generate_signing_key()  # a forger without the chain key
    _tamper(settings, "UPDATE ledger.entries SET signature = :sig WHERE seq = :seq",
            {"sig": sign_message(signed_message(forged["seq"], forged["hash"]), other_key),
             "seq": forged["seq"]})
    _tamper(settings, "UPDATE ledger.entries SET signature = NULL, key_id = NULL "
            "WHERE seq = :seq", {"seq": unsigned["seq"]})
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    assert any(p.startswith(f"entry {forged['seq']}: signature invalid") for p in problems), \
        problems
    assert f"entry {unsigned['seq']}: unsigned after signed entries" in problems, problems
    assert report["signatures_checked"] == len(rows) - 1


def test_an_edited_anchor_line_is_named(client: TestClient, settings: LedgerSettings) -> None:
    new_budget(client, DATASET, epsilon_limit=8.0)
    _run_job(client, "job_e1")
    path = _anchor(settings)
    lines = path.read_text().splitlines()
    # lower the anchored charge of the first lease (line 4), keep its hash and signature
    record = json.loads(lines[3])
    assert record["kind"] == "lease_granted"
    record["payload"]["rdp_delta"]["*"] /= 10
    lines[3] = json.dumps(record)
    # and point line 5's hash elsewhere
    other = json.loads(lines[4])
    other["hash"] = "0" * 64
    lines[4] = json.dumps(other)
    path.write_text("\n".join(lines) + "\n")
    report = client.get("/v1/chain/verify").json()
    assert report["ok"] is False
    problems = report["problems"]
    assert "anchor line 4 (entry 4): content does not hash to its recorded hash (edited)" \
        in problems, problems
    assert any(p.startswith("anchor line 5 (entry 5): signature invalid") for p in problems)
    assert any(p.startswith("anchor line 5: anchored entry 5 differs from the database's")
               for p in problems), problems
    # the head's line is intact, so the ledger is not behind: reads and writes go on
    assert report["anchor"]["behind"] is False


def test_the_anchor_file_only_grows(client: TestClient, settings: LedgerSettings) -> None:
    path = _anchor(settings)
    snapshots: list[bytes] = []
    new_budget(client, DATASET, epsilon_limit=8.0)
    snapshots.append(path.read_bytes())
    rid = _run_job(client, "job_g1", leases=1)
    snapshots.append(path.read_bytes())
    refused = _reserve(client, "job_g2", target=50.0, steps=10_000)  # refused: still anchored
    assert refused.status_code == 409, refused.text
    snapshots.append(path.read_bytes())
    assert client.post(f"/v1/reservations/{rid}/close",
                       json={"outcome": "succeeded"}).status_code == 200
    snapshots.append(path.read_bytes())
    for before, after in itertools.pairwise(snapshots):
        assert len(after) > len(before) and after.startswith(before)
    kinds = [x["kind"] for x in _lines(settings)]
    assert kinds[-2:] == ["reservation_refused", "reservation_closed"]
    assert len(kinds) == len(_db_entries(settings))


@contextmanager
def _ledger(settings: LedgerSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=AUTH) as c:
        yield c


def _clone_database(settings: LedgerSettings, name: str) -> str:
    """``CREATE DATABASE name TEMPLATE <the ledger's>`` (a backup); returns its URL."""
    url = make_url(settings.database.url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{url.database}"'))
    finally:
        admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def test_restored_backup_is_refused_until_reconciled(settings: LedgerSettings) -> None:
    with _ledger(settings) as c:
        new_budget(c, DATASET, epsilon_limit=8.0, partitions=["a", "b"])
        rid = _run_job(c, "job_r1", leases=1)
    backup_url = _clone_database(settings, f"{make_url(settings.database.url).database}_bak")
    with _ledger(settings) as c:  # after the backup: more charges, a new budget
        for i in (1, 2):
            r = c.post(f"/v1/reservations/{rid}/leases",
                       json={"attempt": 1, "start_step": 50 * i, "steps": 50})
            assert r.status_code == 201, r.text
        r = c.post(f"/v1/budgets/{DATASET}/histogram-releases", json={"target_epsilon": 0.5})
        assert r.status_code == 201, r.text
        new_budget(c, "ds_anchor_late", epsilon_limit=4.0)
        _run_job(c, "job_r2", leases=1, dataset_id="ds_anchor_late")
        before = {d: _spent(c, d) for d in (DATASET, "ds_anchor_late")}
        tight_before = c.get(f"/v1/budgets/{DATASET}").json()["dataset_tight_epsilon"]
    restored = settings.model_copy(update={"database": settings.database.model_copy(
        update={"url": backup_url})})
    with _ledger(restored) as c:  # the ledger restarted on the restored database
        ready = c.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["code"] == "ledger_behind_anchor"
        assert "reconcile-after-restore" in ready.json()["detail"]
        status = c.get("/v1/anchor").json()
        assert status["behind"] is True and status["anchored_seq"] > status["local_seq"]
        assert _spent(c, DATASET) < before[DATASET]  # what a silent restore would lose
        r = _reserve(c, "job_r3")
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        r = c.post("/v1/budgets", json={
            "dataset_id": "ds_new", "tenant_id": "t", "epsilon_limit": 1.0, "delta": 1e-6,
            "declared_size": 60_000, "partitions": []})
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        r = c.post(f"/v1/budgets/{DATASET}/histogram-releases", json={"target_epsilon": 0.5})
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        assert c.get(f"/v1/budgets/{DATASET}").status_code == 200  # reads stay available
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is False
        assert any("behind the anchored head" in p for p in verify["problems"])

        report = c.post("/v1/admin/reconcile", json={"api_jobs": []})
        assert report.status_code == 200, report.text
        rep = report.json()
        assert rep["ok"] is True, rep
        assert rep["entries_replayed"] >= 5  # 2 + 1 leases, a histogram, a budget
        for d, spent in before.items():
            assert rep["spent_after"][d] >= spent, (d, rep)
            assert _spent(c, d) >= spent
        assert any(rid in n for n in rep["notes"])  # the rewound reservation was closed
        # the restored charges are part of the realised sequence's tight figure too
        view = c.get(f"/v1/budgets/{DATASET}").json()
        assert view["dataset_tight_epsilon_pending"] is False, view
        assert view["dataset_tight_epsilon"] >= tight_before * (1 - 1e-9), (view, tight_before)
        assert c.get("/readyz").status_code == 200
        assert c.get("/v1/anchor").json()["behind"] is False
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is True, verify["problems"]
        r = _reserve(c, "job_r4")
        assert r.status_code == 201, r.text
        assert c.get("/v1/chain/verify").json()["ok"] is True
        # reconciling again finds nothing more to re-charge
        again = c.post("/v1/admin/reconcile", json={"api_jobs": []}).json()
        assert again["entries_replayed"] == 0 and again["ok"] is True
    kinds = [x["type"] for x in _lines(settings)]
    assert kinds.count("rebase") == 1  # the old lineage stays in the log


def test_api_job_unknown_to_ledger_and_anchor_is_charged(settings: LedgerSettings) -> None:
    with _ledger(settings) as c:
        new_budget(c, DATASET, epsilon_limit=8.0)
        before = _spent(c, DATASET)
        job = {"job_id": "job_api1", "dataset_id": DATASET, "reservation_id": "res_unknown",
               "state": "running", "steps": 100, "noise_multiplier": 1.2,
               "sample_rate": 0.01, "expected_batch_size": 600, "target_epsilon": 1.0}
        rep = c.post("/v1/admin/reconcile", json={"api_jobs": [job]}).json()
        assert rep["jobs_recharged"] == ["job_api1"], rep
        assert rep["spent_after"][DATASET] > before
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is True, verify["problems"]
        # the charge is now in the chain: a second run charges nothing more
        rep2 = c.post("/v1/admin/reconcile", json={"api_jobs": [job]}).json()
        assert rep2["spent_after"][DATASET] == rep["spent_after"][DATASET]


def test_upgrade_of_an_unanchored_ledger_adopts_its_head(database_url: str) -> None:
    from .conftest import make_settings

    settings = make_settings(database_url)
    upgrade(settings)
    with _ledger(settings) as c:
        new_budget(c, DATASET)
    _anchor(settings).unlink()  # as if the chain predated the anchor
    with _ledger(settings) as c:
        assert c.get("/readyz").status_code == 200
        status = c.get("/v1/anchor").json()
        assert status["anchored_seq"] == status["local_seq"] == 1
        assert _lines(settings)[0]["type"] == "rebase"
        new_budget(c, "ds_after")
        assert c.get("/v1/chain/verify").json()["ok"] is True


def test_s3_anchor_one_object_per_record(database_url: str, s3_endpoint: str) -> None:
    """The object-store anchor on a real S3 server: the same records, one object each."""
    from dpsynth_ledger.anchor import S3Anchor
    from dpsynth_ledger.settings import AnchorSettings
    from minio import Minio
    from pydantic import SecretStr

    from .conftest import make_settings

    bucket = f"anchor-{make_url(database_url).database}".replace("_", "-")
    settings = make_settings(database_url, anchor=AnchorSettings(
        kind="s3", s3_endpoint=s3_endpoint, s3_access_key=SecretStr("anchor-test"),
        s3_secret_key=SecretStr("anchor-test-secret"), s3_bucket=bucket,
        s3_prefix="ledger/"))
    upgrade(settings)
    with _ledger(settings) as c:
        new_budget(c, DATASET, epsilon_limit=8.0)
        _run_job(c, "job_s3", leases=1)
        report = c.get("/v1/chain/verify").json()
        assert report["ok"] is True, report["problems"]
        assert report["anchor"]["location"] == f"s3://{bucket}/ledger/"
        assert report["anchor"]["anchored_seq"] == report["entries"] == 4
    client = Minio(s3_endpoint, access_key="anchor-test", secret_key="anchor-test-secret",
                   secure=False)
    names = sorted(o.object_name for o in client.list_objects(bucket, prefix="ledger/"))
    assert names == [f"ledger/{n:016d}.json" for n in range(1, 5)]
    fresh = S3Anchor(client, bucket, "ledger/")  # a restarted ledger finds the same log
    assert [r["seq"] for r in fresh.records()] == [1, 2, 3, 4]
    assert fresh.last() is not None and fresh.last()["seq"] == 4  # type: ignore[index]
    other = S3Anchor(client, bucket, "ledger/")  # a second writer appends after it
    other.append([{"type": "entry", "lineage": 0, "seq": 5, "hash": "x"}])
    assert fresh.last() == {"type": "entry", "lineage": 0, "seq": 5, "hash": "x",
                            "where": "object ledger/0000000000000005.json"}


def test_a_rewound_anchor_is_diverged_until_reconciled(client: TestClient,
                                                       settings: LedgerSettings) -> None:
    """Entries the anchor never saw (its log truncated or replaced) also block writes."""
    new_budget(client, DATASET, epsilon_limit=8.0)
    _run_job(client, "job_d1", leases=1)
    path = _anchor(settings)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # the last record is gone
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["code"] == "ledger_behind_anchor"
    status = client.get("/v1/anchor").json()
    assert status["diverged"] is True and status["behind"] is False
    r = _reserve(client, "job_d2")
    assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
    rep = client.post("/v1/admin/reconcile", json={"api_jobs": []}).json()
    assert rep["ok"] is True and rep["entries_replayed"] == 0, rep
    assert client.get("/readyz").status_code == 200
    assert _reserve(client, "job_d2").status_code == 201
    assert client.get("/v1/chain/verify").json()["ok"] is True
