"""The reaper (lapsed heartbeats → interrupted → requeued / failed), artifacts downloads,
bootstrap, readiness, migrations, and a real Celery message through Redis."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from dpsynth_api import tables  # noqa: F401
from dpsynth_api.adapters.celery_sender import CelerySender
from dpsynth_api.db import Base, make_session_factory
from dpsynth_api.migrate import alembic_config
from dpsynth_api.tenants.service import bootstrap_admin
from sqlalchemy import create_engine, inspect

from tests.integration.api.conftest import Api, auth, make_settings


def _wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def _job(api: Api, token: str, job_id: str) -> dict[str, Any]:
    return api.client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()  # type: ignore[no-any-return]


def test_reaper_requeues_then_fails_after_max_attempts(make_api: Any) -> None:
    api = make_api(lease_ttl_s=2, heartbeat_s=1, max_attempts=2, reaper_enabled=True)
    _, token = api.tenant()
    private, model = api.private_dataset(token), api.model(token)
    job_id = api.finetune(token, private, model).json()["job_id"]
    assert api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"}).status_code == 200
    # No heartbeat: after lease_ttl_s the reaper interrupts and requeues attempt 2.
    _wait_for(lambda: (job_id, 2) in api.sender.sent)
    job = _job(api, token, job_id)
    assert job["state"] == "queued" and job["attempt"] == 2
    assert api.ledger.closed == []  # the reservation stays open across attempts
    stale = api.worker(f"{job_id}/heartbeat", {"attempt": 1, "step": 1, "total": 6})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_attempt"
    assert api.worker(f"{job_id}/claim", {"attempt": 2, "worker_id": "w"}).status_code == 200
    _wait_for(lambda: _job(api, token, job_id)["state"] == "failed")
    job = _job(api, token, job_id)
    assert job["error"]["code"] == "too_many_attempts" and job["attempt"] == 2
    assert api.ledger.closed == [(job["privacy"]["reservation_id"], "failed")]
    assert api.sender.sent == [(job_id, 1), (job_id, 2)]


def test_reaper_leaves_beating_jobs_and_ends_lapsed_cancelling_ones(make_api: Any) -> None:
    api = make_api(lease_ttl_s=2, heartbeat_s=1)
    reaper = api.client.app.state.reaper  # type: ignore[attr-defined]
    _, token = api.tenant()
    private, model = api.private_dataset(token), api.model(token)
    alive = api.finetune(token, private, model, epsilon=1.0).json()["job_id"]
    lost = api.finetune(token, private, model, epsilon=1.0).json()["job_id"]
    for job_id in (alive, lost):
        api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    api.client.post(f"/v1/jobs/{lost}/cancel", headers=auth(token))
    time.sleep(1.2)
    api.worker(f"{alive}/heartbeat", {"attempt": 1, "step": 1, "total": 6})
    time.sleep(1.2)
    api.worker(f"{alive}/heartbeat", {"attempt": 1, "step": 2, "total": 6})
    report = reaper.reap_once()
    assert report.cancelled == [lost] and report.interrupted == [] and report.requeued == []
    assert _job(api, token, alive)["state"] == "running"
    assert _job(api, token, lost)["state"] == "cancelled"
    rid = _job(api, token, lost)["privacy"]["reservation_id"]
    assert api.ledger.closed == [(rid, "cancelled")]


def test_artifact_download_presign_and_owner_only(api: Api, tmp_path: Path) -> None:
    tenant_id, owner = api.tenant()
    model = api.model(owner)
    job_id = api.client.post("/v1/jobs", json={"type": "generate", "model_id": model},
                             headers=auth(owner)).json()["job_id"]
    api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    corpus_key = f"corpora/{job_id}/corpus.zip"
    info = api.store.put_bytes(corpus_key, b"PK-corpus-bytes" * 1000)
    corpus = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "corpus", "object_key": corpus_key, "sha256": info.sha256,
        "size": info.size, "metadata": {"samples": 10}}).json()["artifact_id"]
    stats_key = f"owner/{job_id}/private-stats-1.json"
    stats_info = api.store.put_bytes(stats_key, b'{"loss": 1}')
    stats = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "private_stats", "object_key": stats_key,
        "sha256": stats_info.sha256, "size": stats_info.size}).json()["artifact_id"]
    r = api.client.get(f"/v1/artifacts/{corpus}/download", headers=auth(owner))
    assert r.status_code == 200 and r.content == b"PK-corpus-bytes" * 1000
    assert f'filename="{job_id}-corpus.zip"' in r.headers["content-disposition"]
    meta = api.client.get(f"/v1/artifacts/{corpus}", headers=auth(owner)).json()
    assert meta["sha256"] == info.sha256 and meta["labels"] == {"samples": 10}
    presigned = api.client.get(f"/v1/artifacts/{corpus}/download?presign=true",
                               headers=auth(owner))
    assert presigned.status_code == 200 and presigned.json()["url"]
    refused = api.client.get(f"/v1/artifacts/{stats}/download?presign=true",
                             headers=auth(owner))
    assert refused.status_code == 403 and refused.json()["code"] == "presign_refused"
    reader = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["read"]},
                             headers=auth(api.admin)).json()["api_key"]
    hidden = api.client.get(f"/v1/artifacts/{stats}/download", headers=auth(reader))
    assert hidden.status_code == 403 and hidden.json()["code"] == "forbidden"
    listed = api.client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth(reader)).json()
    assert [a["artifact_id"] for a in listed["items"]] == [corpus]
    assert api.client.get(f"/v1/artifacts/{stats}/download",
                          headers=auth(owner)).content == b'{"loss": 1}'


def test_bootstrap_is_idempotent_and_private(migrated_url: str, tmp_path: Path) -> None:
    settings = make_settings(migrated_url, tmp_path)
    creds = tmp_path / "secrets" / "admin.json"
    engine = create_engine(migrated_url)
    sessions = make_session_factory(engine)
    with sessions() as session:
        assert bootstrap_admin(session, credentials_file=creds, api_url="http://api:8000")
    first = creds.read_text()
    assert stat.S_IMODE(os.stat(creds).st_mode) == 0o600
    body = json.loads(first)
    assert body["api_url"] == "http://api:8000" and body["api_key"].startswith("dps_")
    with sessions() as session:
        assert not bootstrap_admin(session, credentials_file=creds, api_url="http://x")
    creds.unlink()
    with sessions() as session:  # an admin exists: no second one, no file
        assert not bootstrap_admin(session, credentials_file=creds, api_url="http://x")
    assert not creds.exists()
    engine.dispose()
    from dpsynth_api.app import create_app
    from dpsynth_api.fakes import FakeLedger, RecordingSender
    from dpsynth_shared.stores.local import LocalDirStore
    from fastapi.testclient import TestClient

    app = create_app(settings, store=LocalDirStore(tmp_path / "o"), ledger=FakeLedger(),
                     task_sender=RecordingSender())
    with TestClient(app) as client:
        r = client.post("/v1/tenants", json={"name": "t"},
                        headers=auth(body["api_key"]))
        assert r.status_code == 201


def test_readyz(api: Api) -> None:
    assert api.client.get("/readyz").json()["checks"] == {"database": True, "ledger": True,
                                                          "broker": True}
    api.ledger.is_ready = False
    r = api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["code"] == "service_unavailable"
    assert r.json()["checks"]["ledger"] is False
    assert api.client.get("/healthz").status_code == 200
    assert api.client.get("/openapi.json").json()["info"]["title"] == "dpsynth api"
    assert api.client.get("/docs").status_code == 200


def test_migrations_up_down_up_and_autogenerate_empty(database_url: str,
                                                      tmp_path: Path) -> None:
    cfg = alembic_config(make_settings(database_url, tmp_path))
    engine = create_engine(database_url)
    command.upgrade(cfg, "head")
    assert {"jobs", "datasets", "artifacts"} <= set(inspect(engine).get_table_names("api"))
    command.downgrade(cfg, "base")
    assert set(inspect(engine).get_table_names("api")) == {"alembic_version"}
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "include_schemas": True, "version_table_schema": "api",
            "include_name": lambda name, type_, _: type_ != "schema" or name == "api"})
        assert compare_metadata(ctx, Base.metadata) == []
    engine.dispose()


@pytest.mark.timeout(120)
def test_celery_sender_puts_the_task_on_redis(redis_url: str) -> None:
    from kombu import Connection, Queue

    # A database of its own: other tests' platforms queue their jobs on the session's db 0.
    redis_url = redis_url.rsplit("/", 1)[0] + "/11"
    sender = CelerySender(redis_url)
    assert sender.ping()
    sender.send_run_job("job_0123", 3)
    sender.close()
    with Connection(redis_url) as conn:
        queue = Queue("dpsynth", routing_key="dpsynth")
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = queue(conn.channel()).get(no_ack=True)
        assert message is not None
        assert message.headers["task"] == "dpsynth.run_job"
        args, kwargs, _ = message.decode()
        assert args == ["job_0123", 3] and kwargs == {}
        assert message.delivery_info["routing_key"] == "dpsynth"
