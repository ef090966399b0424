"""Key rotation without downtime (issue 6): grant keys, worker tokens, chain keys.

Each secret the services verify can be held in two versions at once while it is rotated:
the read-grant verifiers (the object stores of the api and the workers) take the current and
the retired grant public keys, the api takes the current and retired worker tokens, and the
ledger verifies entries and anchor records signed before a chain-key rotation with the
retired chain public keys (entries carry the id of the key that signed them). See
docs/deploy.md ("Key rotation").
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from dpsynth_api.deps import require_worker
from dpsynth_api.settings import ApiSettings
from dpsynth_cli.ledger import verify_export
from dpsynth_ledger.anchor import ChainKeeper, FileAnchor
from dpsynth_ledger.chain import _check_record, entry_hash
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.dp_events import GENESIS_HASH
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.grants import (
    GrantClaims,
    generate_signing_key,
    key_id_of,
    public_key_of,
    sign_grant,
    verify_grant,
)
from dpsynth_shared.stores.local import LocalDirStore
from dpsynth_worker.settings import WorkerSettings
from pydantic import ValidationError
from starlette.requests import Request

OLD, NEW = generate_signing_key(), generate_signing_key()
OLD_PUBLIC, NEW_PUBLIC = public_key_of(OLD), public_key_of(NEW)
TOKEN_OLD = "worker-token-old-0123456789abcdef"
TOKEN_NEW = "worker-token-new-0123456789abcdef"


def _grant(key: str, dataset_id: str = "ds_1") -> str:
    return sign_grant(GrantClaims(grant_id=uuid.uuid4().hex, dataset_id=dataset_id,
                                  reservation_id="res_1", job_id="job_1", attempt=1,
                                  expires_at=time.time() + 60), key)


def _api_settings(**overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "database": {"url": "postgresql+psycopg://u:p@db.invalid/api"},
        "ledger": {"url": "http://ledger.invalid", "token": "ledger-token-0123456789"},
        "worker_token": TOKEN_NEW, "record_hash_key": "record-hash-key-0123456789abcdef"}
    values.update(overrides)
    return ApiSettings(**values)


def _request(token: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/internal/v1/jobs/x/claim",
                    "headers": [(b"authorization", f"Bearer {token}".encode())]})


# -- read grants ---------------------------------------------------------------------------

def test_a_grant_signed_with_the_old_key_is_accepted_during_rollover_and_refused_after(
        tmp_path: Path) -> None:
    old_grant, new_grant = _grant(OLD), _grant(NEW)
    during = [NEW_PUBLIC, OLD_PUBLIC]
    assert verify_grant(old_grant, during).dataset_id == "ds_1"
    assert verify_grant(new_grant, during).dataset_id == "ds_1"
    assert verify_grant(old_grant, OLD_PUBLIC).dataset_id == "ds_1"  # one key, as before
    with pytest.raises(DpsynthError) as refused:
        verify_grant(old_grant, [NEW_PUBLIC])
    assert str(refused.value.code) == "invalid_grant"
    with pytest.raises(DpsynthError):
        verify_grant(new_grant, [])  # no key at all: nothing verifies

    key = "private/datasets/ds_1/data.bin"
    rolling = LocalDirStore(tmp_path / "objects", grant_public_key=during)
    rolling.put_bytes(key, b"rows")
    rolling.get_file(key, tmp_path / "a", grant=old_grant)
    rolling.get_file(key, tmp_path / "b", grant=new_grant)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == b"rows"
    after = LocalDirStore(tmp_path / "objects", grant_public_key=NEW_PUBLIC)
    after.get_file(key, tmp_path / "c", grant=new_grant)
    with pytest.raises(DpsynthError):
        after.get_file(key, tmp_path / "d", grant=old_grant)


def test_grant_verifier_settings_take_a_retired_key_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_WORKER_BROKER_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("DPSYNTH_WORKER_API__URL", "http://api")
    monkeypatch.setenv("DPSYNTH_WORKER_API__TOKEN", TOKEN_NEW)
    monkeypatch.setenv("DPSYNTH_WORKER_LEDGER__URL", "http://ledger")
    monkeypatch.setenv("DPSYNTH_WORKER_LEDGER__TOKEN", TOKEN_NEW)
    monkeypatch.setenv("DPSYNTH_WORKER_GRANT_PUBLIC_KEY", NEW_PUBLIC)
    assert WorkerSettings().grant_public_keys == [NEW_PUBLIC]  # type: ignore[call-arg]
    monkeypatch.setenv("DPSYNTH_WORKER_GRANT_RETIRED_PUBLIC_KEYS", f'["{OLD_PUBLIC}"]')
    assert WorkerSettings().grant_public_keys == [  # type: ignore[call-arg]
        NEW_PUBLIC, OLD_PUBLIC]
    api = _api_settings(grant_public_key=NEW_PUBLIC, grant_retired_public_keys=[OLD_PUBLIC])
    assert api.grant_public_keys == [NEW_PUBLIC, OLD_PUBLIC]
    assert _api_settings().grant_public_keys == []  # the api without a key stays keyless
    with pytest.raises(ValidationError, match="DPSYNTH_API_GRANT_RETIRED_PUBLIC_KEYS"):
        _api_settings(grant_retired_public_keys=["not-a-key"])
    monkeypatch.setenv("DPSYNTH_WORKER_GRANT_RETIRED_PUBLIC_KEYS", '["not-a-key"]')
    with pytest.raises(ValidationError, match="DPSYNTH_WORKER_GRANT_RETIRED_PUBLIC_KEYS"):
        WorkerSettings()  # type: ignore[call-arg]


# -- worker tokens -------------------------------------------------------------------------

def test_an_old_worker_token_is_accepted_while_listed_and_refused_after_removal() -> None:
    rolling = _api_settings(worker_retired_tokens=[TOKEN_OLD])
    require_worker(_request(TOKEN_NEW), rolling)
    require_worker(_request(TOKEN_OLD), rolling)
    after = _api_settings()
    require_worker(_request(TOKEN_NEW), after)
    for token in (TOKEN_OLD, "", "worker-token-forged-0123456789abcd"):
        with pytest.raises(DpsynthError) as refused:
            require_worker(_request(token), after)
        assert str(refused.value.code) == "unauthenticated"


def test_a_weak_retired_worker_token_fails_at_start() -> None:
    with pytest.raises(ValidationError, match="DPSYNTH_API_WORKER_RETIRED_TOKENS"):
        _api_settings(worker_retired_tokens=["short"])


def test_the_api_reads_retired_worker_tokens_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_API_WORKER_RETIRED_TOKENS", f'["{TOKEN_OLD}"]')
    settings = _api_settings()
    assert settings.worker_tokens == [TOKEN_NEW, TOKEN_OLD]


# -- the chain key -------------------------------------------------------------------------

def _record(keeper: ChainKeeper, seq: int, prev: str) -> dict[str, Any]:
    payload = {"v": 1, "kind": "budget_created"}
    digest = entry_hash(prev, seq=seq, dataset_id="ds_1", kind="budget_created",
                        payload=payload)
    return keeper.entry_record(lineage=1, seq=seq, at=datetime.now(UTC), dataset_id="ds_1",
                               kind="budget_created", payload=payload, prev_hash=prev,
                               digest=digest, signature=keeper.sign(seq, digest))


def test_the_chain_keeper_verifies_with_the_key_an_entry_names(tmp_path: Path) -> None:
    anchor = FileAnchor(tmp_path / "anchor.jsonl")
    before = ChainKeeper(OLD, anchor)
    old_record = _record(before, 1, GENESIS_HASH)
    after = ChainKeeper(NEW, anchor, [OLD_PUBLIC, NEW_PUBLIC])  # the current key is skipped
    assert after.retired_public_keys == [OLD_PUBLIC]
    assert after.key_id == key_id_of(NEW_PUBLIC)
    new_record = _record(after, 2, old_record["hash"])
    assert new_record["key_id"] == key_id_of(NEW_PUBLIC) != old_record["key_id"]
    for record in (old_record, new_record):
        assert after.verify(record["seq"], record["hash"], record["signature"],
                            record["key_id"])
        problems: list[str] = []
        _check_record(record, after, problems)
        assert problems == []
    # a key id the keeper does not know verifies nothing (no fallback to the current key)
    assert not after.verify(1, old_record["hash"], old_record["signature"], "0" * 16)
    forgetful = ChainKeeper(NEW, anchor)  # rotated without listing the retired key
    problems = []
    _check_record(old_record, forgetful, problems)
    assert len(problems) == 1 and "nor a retired chain key" in problems[0]


def test_ledger_settings_validate_retired_chain_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER_DATABASE__URL", "postgresql+psycopg://u:p@db/ledger")
    monkeypatch.setenv("DPSYNTH_LEDGER_SERVICE_TOKENS", f'["{TOKEN_NEW}"]')
    monkeypatch.setenv("DPSYNTH_LEDGER_GRANT_SIGNING_KEY", generate_signing_key())
    monkeypatch.setenv("DPSYNTH_LEDGER_CHAIN_SIGNING_KEY", NEW)
    assert LedgerSettings().chain_retired_public_keys == []  # type: ignore[call-arg]
    monkeypatch.setenv("DPSYNTH_LEDGER_CHAIN_RETIRED_PUBLIC_KEYS", f'["{OLD_PUBLIC}"]')
    assert LedgerSettings().chain_retired_public_keys == [  # type: ignore[call-arg]
        OLD_PUBLIC]
    monkeypatch.setenv("DPSYNTH_LEDGER_CHAIN_RETIRED_PUBLIC_KEYS", '["not-a-key"]')
    with pytest.raises(ValidationError, match="CHAIN_RETIRED_PUBLIC_KEYS"):
        LedgerSettings()  # type: ignore[call-arg]


def _export(retired: list[str]) -> dict[str, Any]:
    """A dataset export whose first entry was signed before a rotation (OLD), the second
    after it (NEW)."""
    entries, prev = [], GENESIS_HASH
    for seq, (kind, key) in enumerate([("budget_created", OLD), ("limit_lowered", NEW)],
                                      start=1):
        keeper = ChainKeeper(key, FileAnchor(Path("/nonexistent/anchor.jsonl")))
        payload = {"v": 1, "kind": kind}
        digest = entry_hash(prev, seq=seq, dataset_id="ds_1", kind=kind, payload=payload)
        entries.append({"seq": seq, "at": "2026-11-21T10:00:00+00:00", "dataset_id": "ds_1",
                        "kind": kind, "payload": payload, "prev_hash": prev, "hash": digest,
                        "signature": keeper.sign(seq, digest), "key_id": keeper.key_id})
        prev = digest
    return {"dataset_id": "ds_1", "budget_id": "ds_1", "public_key": NEW_PUBLIC,
            "key_id": key_id_of(NEW_PUBLIC), "retired_public_keys": retired,
            "entries": entries}


def test_an_export_spanning_a_rotation_verifies_with_the_retired_key() -> None:
    assert verify_export(_export([OLD_PUBLIC])) == ([], 2)
    problems, _ = verify_export(_export([]))
    assert problems == ["entry 1: signature invalid"]
    # pinned by the auditor: the retired key counts only when its id is pinned too (else a
    # forger could list a key of their own as "retired")
    pinned = key_id_of(NEW_PUBLIC)
    problems, _ = verify_export(_export([OLD_PUBLIC]), key_id=pinned)
    assert problems == ["entry 1: signature invalid"]
    assert verify_export(_export([OLD_PUBLIC]), key_id=pinned,
                         retired_key_ids=[key_id_of(OLD_PUBLIC)]) == ([], 2)


def test_a_two_phase_rollout_lets_old_and_new_replicas_verify_each_other(
        tmp_path: Path) -> None:
    """Several ledger replicas: phase 1 lists the NEW public key on every replica (still
    signing with OLD), phase 2 switches; replicas of either phase verify both keys' entries."""
    anchor = FileAnchor(tmp_path / "anchor.jsonl")
    phase1 = ChainKeeper(OLD, anchor, [NEW_PUBLIC])
    phase2 = ChainKeeper(NEW, anchor, [OLD_PUBLIC])
    by_old = _record(phase1, 1, GENESIS_HASH)
    by_new = _record(phase2, 2, by_old["hash"])
    for keeper in (phase1, phase2):
        for record in (by_old, by_new):
            problems: list[str] = []
            _check_record(record, keeper, problems)
            assert problems == [], (keeper.key_id, record["key_id"])
