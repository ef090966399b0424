"""Chain-key rotation on real PostgreSQL (issue 6; docs/deploy.md, "Key rotation").

The ledger restarted with a new ``CHAIN_SIGNING_KEY`` and the old public key in
``CHAIN_RETIRED_PUBLIC_KEYS`` signs new entries with the new key and still verifies the whole
chain and its anchor, including entries and anchor records signed before the rotation; a
restore from a backup taken before the rotation still reconciles (the lost anchor records
were signed by both keys). Without the retired key the old entries are named as unverifiable.
"""

from __future__ import annotations

from typing import Any

from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.grants import generate_signing_key, key_id_of, public_key_of
from pydantic import SecretStr
from sqlalchemy import make_url

from .conftest import new_budget
from .test_ledger_anchor import (
    DATASET,
    _clone_database,
    _db_entries,
    _ledger,
    _lines,
    _run_job,
    _spent,
)


def _rotated(settings: LedgerSettings, key: str, retired: list[str],
             **update: Any) -> LedgerSettings:
    return settings.model_copy(update={"chain_signing_key": SecretStr(key),
                                       "chain_retired_public_keys": retired, **update})


def test_a_rotated_chain_key_keeps_the_chain_verifiable(settings: LedgerSettings) -> None:
    old_public = settings.chain_public_key
    with _ledger(settings) as c:
        new_budget(c, DATASET, epsilon_limit=8.0)
        rid = _run_job(c, "job_k1", leases=1)
    backup_url = _clone_database(settings, f"{make_url(settings.database.url).database}_bak")
    with _ledger(settings) as c:  # after the backup, still the old key
        r = c.post(f"/v1/reservations/{rid}/leases",
                   json={"attempt": 1, "start_step": 50, "steps": 50})
        assert r.status_code == 201, r.text
    signed_old = len(_db_entries(settings))

    new_key = generate_signing_key()
    new_public = public_key_of(new_key)
    rotated = _rotated(settings, new_key, [old_public])
    with _ledger(rotated) as c:
        assert c.get("/readyz").status_code == 200
        key = c.get("/v1/chain/key").json()
        assert key["public_key"] == new_public and key["retired_public_keys"] == [old_public]
        r = c.post(f"/v1/reservations/{rid}/leases",
                   json={"attempt": 1, "start_step": 100, "steps": 50})
        assert r.status_code == 201, r.text
        report = c.get("/v1/chain/verify").json()
        assert report["ok"] is True, report["problems"]
        assert report["signatures_checked"] == report["entries"] > signed_old
        assert report["anchor"]["key_id"] == key_id_of(new_public)
        before = _spent(c)
    rows = _db_entries(settings)
    assert {r["key_id"] for r in rows[:signed_old]} == {key_id_of(old_public)}
    assert {r["key_id"] for r in rows[signed_old:]} == {key_id_of(new_public)}
    assert [x["key_id"] for x in _lines(settings)] == [r["key_id"] for r in rows]

    forgot = _rotated(settings, new_key, [])  # rotated without listing the old public key
    with _ledger(forgot) as c:
        report = c.get("/v1/chain/verify").json()
        assert report["ok"] is False
        assert any(p.startswith("entry 1: signed by key") and "nor a retired one" in p
                   for p in report["problems"])

    # a restore from the backup taken before the rotation: the anchor records the backup
    # lacks were signed by both keys, and reconciliation re-applies them all
    restored = _rotated(settings, new_key, [old_public], database=settings.database.model_copy(
        update={"url": backup_url}))
    with _ledger(restored) as c:
        assert c.get("/readyz").status_code == 503
        rep = c.post("/v1/admin/reconcile", json={"api_jobs": []}).json()
        assert rep["ok"] is True, rep
        assert not any("failed their hash or signature check" in n for n in rep["notes"]), rep
        assert rep["entries_replayed"] >= 2  # one lease signed by each key
        assert _spent(c) >= before
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is True, verify["problems"]
