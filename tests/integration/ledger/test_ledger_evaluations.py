"""Non-DP evaluation reads of private data (issue 5), on the real ledger (PostgreSQL).

An evaluate job on a private reference reads the private records and spends no epsilon, but
the read must be in the audit trail: the api authorises it (``evaluation_authorised``), the
worker takes read grants for the budget's private prefix (``evaluation_read``), both chained,
signed and anchored, neither a charge. Export lists them, verify and recompute accept them,
and reconciliation after a restore re-records a lost one without charging it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dpsynth_cli.ledger import verify_export
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.grants import private_dataset_prefix, public_key_of, verify_grant
from dpsynth_shared.stores.local import LocalDirStore
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import make_url

from .conftest import new_budget
from .test_ledger_anchor import _clone_database, _ledger, _run_job, _spent

DATASET = "ds_eval"


def _authorise(client: TestClient, job_id: str = "job_eval1", dataset_id: str = DATASET,
               **headers: str) -> Any:
    return client.post("/v1/evaluations", headers=headers or None, json={
        "dataset_id": dataset_id, "job_id": job_id, "reference_dataset_id": "ds_reference",
        "requested_by": "key_owner"})


def _grant(client: TestClient, evaluation_id: str, attempt: int = 1) -> Any:
    return client.post(f"/v1/evaluations/{evaluation_id}/grant",
                       json={"attempt": attempt, "worker_id": "worker-1"})


def _reads(client: TestClient) -> float:
    text = client.get("/metrics").text
    return next(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == "dpsynth_ledger_evaluation_reads_total")


def _entries(client: TestClient, dataset_id: str = DATASET) -> list[dict[str, Any]]:
    r = client.get("/v1/entries", params={"dataset_id": dataset_id})
    assert r.status_code == 200, r.text
    return list(r.json())


def test_authorise_grant_entries_verify_export_and_recompute(
        client: TestClient, settings: LedgerSettings) -> None:
    new_budget(client, DATASET, partitions=["a", "b"])
    _run_job(client, "job_dp", dataset_id=DATASET, leases=1)  # some epsilon already spent
    spent = _spent(client, DATASET)
    reads_before = _reads(client)

    r = _authorise(client)
    assert r.status_code == 201, r.text
    ev = r.json()
    assert ev["evaluation_id"].startswith("evl_") and ev["grants"] == 0
    assert ev["touched_at"] is None and ev["purpose"] == "evaluate"
    again = _authorise(client)  # idempotent on job_id: same evaluation, no second entry
    assert again.status_code == 201 and again.json()["evaluation_id"] == ev["evaluation_id"]

    g = _grant(client, ev["evaluation_id"])
    assert g.status_code == 201, g.text
    grant = g.json()
    assert grant["reservation_id"] == ev["evaluation_id"] and grant["dataset_id"] == DATASET
    claims = verify_grant(grant["token"], settings.grant_public_key)
    assert claims.prefix == private_dataset_prefix(DATASET)
    assert 0 < claims.expires_at - time.time() <= settings.lease_ttl_s  # short-lived
    assert claims.job_id == "job_eval1" and claims.reservation_id == ev["evaluation_id"]
    assert _grant(client, ev["evaluation_id"], attempt=2).status_code == 201

    listed = client.get(f"/v1/datasets/{DATASET}/evaluations").json()
    assert [e["evaluation_id"] for e in listed] == [ev["evaluation_id"]]
    assert listed[0]["grants"] == 2 and listed[0]["touched_at"] is not None
    assert _reads(client) == reads_before + 2

    entries = _entries(client)
    kinds = [e["kind"] for e in entries]
    assert kinds.count("evaluation_authorised") == 1 and kinds.count("evaluation_read") == 2
    for e in entries:
        if e["kind"].startswith("evaluation_"):
            p = e["payload"]
            assert e["signature"] and e["key_id"]
            assert "rdp_delta" not in p and p["non_dp"] is True and p["rdp_charged"] == 0.0
            assert p["evaluation_id"] == ev["evaluation_id"]
            assert p["figures"]["dataset_epsilon_spent"] == spent  # nothing charged
    # the anchor has them too, in chain order
    anchored = [line for line in Path(settings.anchor.path).read_text().splitlines()
                if "evaluation_read" in line]
    assert len(anchored) == 2

    assert _spent(client, DATASET) == spent
    chain = client.get("/v1/chain/verify").json()
    assert chain["ok"] is True, chain["problems"]
    one = client.get(f"/v1/budgets/{DATASET}/verify").json()
    assert one["ok"] is True, one["problems"]
    recompute = client.get(f"/v1/budgets/{DATASET}/recompute").json()
    assert recompute["differences"] == []
    assert all(not c["kind"].startswith("evaluation_") for c in recompute["charges"])

    # the export a user downloads, checked independently by the CLI's verifier
    key = client.get("/v1/chain/key").json()
    export = {"dataset_id": DATASET, "budget_id": DATASET, "public_key": key["public_key"],
              "key_id": key["key_id"], "entries": entries}
    problems, checked = verify_export(export, public_key=key["public_key"])
    assert problems == [] and checked == len(entries)


def test_the_grant_opens_the_budgets_private_prefix_only(client: TestClient,
                                                          settings: LedgerSettings,
                                                          tmp_path: Path) -> None:
    new_budget(client, DATASET)
    new_budget(client, "ds_other")
    store = LocalDirStore(tmp_path / "store", grant_public_key=public_key_of(
        settings.grant_signing_key.get_secret_value()))
    mine = private_dataset_prefix(DATASET) + "holdout.npz"
    theirs = private_dataset_prefix("ds_other") + "images.npz"
    store.put_bytes(mine, b"held-out records")
    store.put_bytes(theirs, b"someone else's records")
    ev = _authorise(client).json()
    token = _grant(client, ev["evaluation_id"]).json()["token"]
    got = store.get_file(mine, tmp_path / "out.npz", grant=token)
    assert (tmp_path / "out.npz").read_bytes() == b"held-out records" and got.size == 16
    with pytest.raises(DpsynthError) as err:
        store.get_file(theirs, tmp_path / "no.npz", grant=token)
    assert err.value.code == "invalid_grant"
    with pytest.raises(DpsynthError) as err:
        store.get_file(mine, tmp_path / "no.npz")
    assert err.value.code == "read_grant_required"


def test_unknown_ids_conflicts_and_tokens(client: TestClient) -> None:
    new_budget(client, DATASET)
    r = _authorise(client, dataset_id="ds_missing")
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    r = _grant(client, "evl_" + "0" * 32)
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    r = client.get("/v1/datasets/ds_missing/evaluations")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert client.get(f"/v1/datasets/{DATASET}/evaluations").json() == []
    ev = _authorise(client).json()
    new_budget(client, "ds_eval_b")
    r = _authorise(client, dataset_id="ds_eval_b")  # the same job on other data
    assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
    r = client.post("/v1/evaluations", json={"dataset_id": DATASET, "job_id": "j",
                                             "reference_dataset_id": "d", "requested_by": "k",
                                             "purpose": "train"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    r = client.post(f"/v1/evaluations/{ev['evaluation_id']}/grant",
                    json={"attempt": 0, "worker_id": "w"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    for headers in ({"Authorization": "Bearer not-a-service-token-0123456789"},
                    {"Authorization": ""}):
        r = client.post("/v1/evaluations", headers=headers, json={
            "dataset_id": DATASET, "job_id": "job_x", "reference_dataset_id": "d",
            "requested_by": "k"})
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated", r.text
        r = client.post(f"/v1/evaluations/{ev['evaluation_id']}/grant", headers=headers,
                        json={"attempt": 1, "worker_id": "w"})
        assert r.status_code == 401
        assert client.get(f"/v1/datasets/{DATASET}/evaluations",
                          headers=headers).status_code == 401
    # nothing was granted to the refused callers
    assert client.get(f"/v1/datasets/{DATASET}/evaluations").json()[0]["grants"] == 0


def test_behind_anchor_refused_and_a_lost_read_is_rerecorded_uncharged(
        settings: LedgerSettings) -> None:
    with _ledger(settings) as c:
        new_budget(c, DATASET, partitions=["a"])
        _run_job(c, "job_dp", dataset_id=DATASET, leases=1)
        ev_old = _authorise(c, "job_eval_old").json()
    backup_url = _clone_database(settings, f"{make_url(settings.database.url).database}_ev")
    with _ledger(settings) as c:  # after the backup: a new evaluation and two reads
        ev = _authorise(c, "job_eval_new").json()
        assert _grant(c, ev["evaluation_id"]).status_code == 201
        assert _grant(c, ev_old["evaluation_id"]).status_code == 201
        spent = _spent(c, DATASET)
    restored = settings.model_copy(update={"database": settings.database.model_copy(
        update={"url": backup_url})})
    with _ledger(restored) as c:
        r = _authorise(c, "job_eval_late")
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        r = _grant(c, ev_old["evaluation_id"])
        assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
        assert c.get(f"/v1/datasets/{DATASET}/evaluations").status_code == 200  # reads work
        assert [e["grants"] for e in c.get(f"/v1/datasets/{DATASET}/evaluations").json()] \
            == [0]

        rep = c.post("/v1/admin/reconcile", json={"api_jobs": []}).json()
        assert rep["ok"] is True, rep
        assert rep["entries_replayed"] >= 3, rep  # authorisation + two reads
        assert not any("is not re-applied" in n for n in rep["notes"]), rep["notes"]
        assert rep["spent_after"][DATASET] == rep["spent_before"][DATASET] == spent
        listed = {e["job_id"]: e for e in c.get(f"/v1/datasets/{DATASET}/evaluations").json()}
        assert listed["job_eval_new"]["evaluation_id"] == ev["evaluation_id"]
        assert listed["job_eval_new"]["grants"] == 1
        assert listed["job_eval_old"]["grants"] == 1
        restored_entries = [e for e in _entries(c) if e["kind"].startswith("evaluation_")
                            and "restored_from" in e["payload"]]
        assert len(restored_entries) == 3
        assert all("rdp_delta" not in e["payload"] for e in restored_entries)
        verify = c.get("/v1/chain/verify").json()
        assert verify["ok"] is True, verify["problems"]
        assert c.get(f"/v1/budgets/{DATASET}/verify").json()["ok"] is True
        # writes work again, and a second reconciliation re-records nothing
        assert _grant(c, ev["evaluation_id"]).status_code == 201
        again = c.post("/v1/admin/reconcile", json={"api_jobs": []}).json()
        assert again["entries_replayed"] == 0 and again["ok"] is True
        assert _spent(c, DATASET) == spent
