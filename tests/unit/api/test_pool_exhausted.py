"""A burst that exhausts the api's database pool gets a retryable 503, never a 500
(benchmarks/service_load.py found 500s under 32 concurrent finetune submissions)."""

from __future__ import annotations

from dpsynth_api.db import make_engine
from dpsynth_api.errors import install_error_handlers
from dpsynth_shared.settings import DatabaseSettings
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import TimeoutError as PoolTimeout


def test_pool_timeout_is_a_retryable_503_problem() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/busy")
    def busy() -> None:
        raise PoolTimeout("QueuePool limit of size 5 overflow 30 reached")

    response = TestClient(app, raise_server_exceptions=False).get("/busy")
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["retry-after"] == "2"
    body = response.json()
    assert body["code"] == "service_unavailable"
    assert "QueuePool" not in body["detail"]


def test_engine_pool_covers_the_servers_threads() -> None:
    engine = make_engine(DatabaseSettings(url="postgresql+psycopg://u:p@127.0.0.1:1/db"))
    pool = engine.pool
    assert pool.size() + pool._max_overflow >= 35  # type: ignore[attr-defined]
    assert pool._timeout == 10.0  # type: ignore[attr-defined]
