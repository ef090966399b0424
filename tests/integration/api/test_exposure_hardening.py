"""Issue 14, items 10, 13 and 14: no private value in logs, no server path in presigned
URLs, security headers on every api and ledger response (on real responses)."""

from __future__ import annotations

import io
import logging
from datetime import timedelta
from pathlib import Path

import pytest
from dpsynth_api.db import make_engine
from dpsynth_ledger.app import create_app as create_ledger_app
from dpsynth_ledger.migrate import upgrade as upgrade_ledger
from dpsynth_shared.logging import JsonFormatter
from dpsynth_shared.settings import DatabaseSettings
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.integration.api.conftest import Api, auth
from tests.integration.ledger.conftest import AUTH as LEDGER_AUTH
from tests.integration.ledger.conftest import make_settings as ledger_settings

STRICT_CSP = "default-src 'none'; frame-ancestors 'none'"
SECRET_COUNT = 987654321  # a "private per-class count"
SECRET_NAME = "private-class-counts-zebra"


# -- item 10: a failing database write logs no parameter values ---------------------------
def _logged_failure(engine: Engine, statement: str, params: dict[str, object]) -> str:
    """Run a failing write and log its error as the services do; the JSON line."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("api"))
    logger = logging.getLogger("test.exposure")
    logger.addHandler(handler)
    try:
        with pytest.raises(Exception) as excinfo, engine.begin() as conn:
            conn.execute(text(statement), params)
        logger.error("write failed", exc_info=excinfo.value)
        logger.error("write failed: %s", excinfo.value)
    finally:
        logger.removeHandler(handler)
        engine.dispose()
    return out.getvalue()


def _prepare(engine: Engine) -> None:
    with engine.begin() as conn:  # the table the failing writes hit
        conn.execute(text("CREATE TABLE class_counts (label text PRIMARY KEY, "
                          "n smallint NOT NULL)"))
        conn.execute(text("INSERT INTO class_counts VALUES (:label, 1)"),
                     {"label": SECRET_NAME})


@pytest.mark.parametrize(("statement", "params"), [
    # the value is refused by its type (numeric out of range): "[parameters: …]"
    ("INSERT INTO class_counts VALUES ('other', :n)", {"n": SECRET_COUNT}),
    # a unique violation: PostgreSQL's DETAIL line quotes the refused key
    ("INSERT INTO class_counts VALUES (:label, 2)", {"label": SECRET_NAME}),
])
def test_failed_api_write_logs_no_parameters(database_url: str, statement: str,
                                             params: dict[str, object]) -> None:
    _prepare(make_engine(DatabaseSettings(url=database_url)))
    line = _logged_failure(make_engine(DatabaseSettings(url=database_url)), statement, params)
    assert "class_counts" in line  # the failure itself is logged
    assert str(SECRET_COUNT) not in line and SECRET_NAME not in line


def test_failed_ledger_write_logs_no_parameters(database_url: str) -> None:
    settings = ledger_settings(database_url)
    app = create_ledger_app(settings)
    _prepare(app.state.engine)
    line = _logged_failure(app.state.engine, "INSERT INTO class_counts VALUES ('x', :n)",
                           {"n": SECRET_COUNT})
    assert "class_counts" in line and str(SECRET_COUNT) not in line


# -- item 13: presigned URLs of the local store reveal no path ------------------------------
def _corpus(api: Api, owner: str) -> tuple[str, str, bytes]:
    model = api.model(owner)
    job_id = api.client.post("/v1/jobs", json={"type": "generate", "model_id": model},
                             headers=auth(owner)).json()["job_id"]
    api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
    data = b"PK-corpus-bytes" * 100
    info = api.store.put_bytes(f"corpora/{job_id}/corpus.zip", data)
    artifact = api.worker(f"{job_id}/artifacts", {
        "attempt": 1, "kind": "corpus", "object_key": f"corpora/{job_id}/corpus.zip",
        "sha256": info.sha256, "size": info.size}).json()["artifact_id"]
    return artifact, f"corpora/{job_id}/corpus.zip", data


def test_local_presigned_url_is_opaque_and_served_by_the_api(api: Api) -> None:
    _, owner = api.tenant()
    artifact, _, data = _corpus(api, owner)
    presigned = api.client.get(f"/v1/artifacts/{artifact}/download?presign=true",
                               headers=auth(owner)).json()
    url = presigned["url"]
    assert url.startswith("http://testserver/v1/presigned/")
    assert str(api.store.root) not in url and "file:" not in url
    assert "corpora" not in url and "corpus.zip" not in url  # not even the key
    fetched = api.client.get(url)  # no key: the token is the credential
    assert fetched.status_code == 200 and fetched.content == data
    assert fetched.headers["x-dpsynth-sha256"] == presigned["sha256"]
    token = url.rsplit("/", 1)[1]
    altered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    for bad in (altered, "nope", "x" * 200):
        refused = api.client.get(f"/v1/presigned/{bad}")
        assert refused.status_code == 404 and refused.json()["code"] == "not_found"
        assert str(api.store.root) not in refused.text


def test_local_presigned_url_expires(api: Api) -> None:
    _, owner = api.tenant()
    _, key, data = _corpus(api, owner)
    assert api.client.get(api.store.presign_get(key, ttl=timedelta(seconds=60))
                          ).content == data
    expired = api.store.presign_get(key, ttl=timedelta(seconds=0))
    assert api.client.get(expired).status_code == 404


# -- item 14: security headers on real responses ---------------------------------------------
def _assert_private(response: object) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    assert headers["content-security-policy"] == STRICT_CSP


def test_api_security_headers(api: Api) -> None:
    _, owner = api.tenant()
    listed = api.client.get("/v1/datasets", headers=auth(owner))
    assert listed.status_code == 200
    _assert_private(listed)
    missing = api.client.get("/v1/datasets/ds_nope", headers=auth(owner))
    assert missing.status_code == 404
    _assert_private(missing)
    _assert_private(api.client.get("/v1/datasets"))  # 401
    _assert_private(api.client.get("/v1/datasets?api_key=x"))  # the guard's 400
    _assert_private(api.client.get("/healthz"))
    dashboard = api.client.get("/dashboard")  # keeps its own policy
    assert dashboard.status_code == 200
    assert "script-src 'self'" in dashboard.headers["content-security-policy"]
    assert dashboard.headers["x-content-type-options"] == "nosniff"
    docs = api.client.get("/docs")  # its own policy: same-origin scripts only, no inline one
    assert docs.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in docs.headers["content-security-policy"]
    assert "unsafe-inline" not in docs.headers["content-security-policy"]


def test_ledger_security_headers(database_url: str, tmp_path: Path) -> None:
    settings = ledger_settings(database_url)
    upgrade_ledger(settings)
    with TestClient(create_ledger_app(settings)) as client:
        _assert_private(client.get("/v1/budgets/ds_nope", headers=LEDGER_AUTH))
        _assert_private(client.get("/v1/budgets/ds_nope"))  # 401
        _assert_private(client.get("/healthz"))
