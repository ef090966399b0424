"""Fixtures of the api's integration tests: a migrated real PostgreSQL database, the app
with a local-directory store, the in-memory ledger and a recording task sender."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpsynth_api.adapters.ledger_http import HttpLedger
from dpsynth_api.app import create_app
from dpsynth_api.db import make_session_factory
from dpsynth_api.fakes import FakeLedger, RecordingSender
from dpsynth_api.migrate import upgrade_head
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tenants.schemas import CreatedTenant
from dpsynth_api.tenants.security import ALL_SCOPES, Scope
from dpsynth_api.tenants.service import create_tenant
from dpsynth_ledger.app import create_app as create_ledger_app
from dpsynth_ledger.migrate import upgrade as upgrade_ledger
from dpsynth_shared.stores.local import LocalDirStore
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from tests.integration.ledger.conftest import TOKEN as LEDGER_TOKEN
from tests.integration.ledger.conftest import make_settings as ledger_settings
from tests.unit.api import builders as b

WORKER_TOKEN = "worker-token-0123456789abcdef"
RECORD_HASH_KEY = "record-hash-key-0123456789abcdef"


def make_settings(database_url: str, tmp_path: Path, **overrides: Any) -> ApiSettings:
    """Settings for a test app (the reaper off unless a test turns it on)."""
    values: dict[str, Any] = {
        "database": {"url": database_url},
        "ledger": {"url": "http://ledger.invalid", "token": "ledger-token-0123456789"},
        "worker_token": WORKER_TOKEN,
        "record_hash_key": RECORD_HASH_KEY,
        "object_store": {"kind": "local", "root": str(tmp_path / "objects")},
        "reaper_enabled": False,
        "max_uncompressed_bytes": 8 * 1024 * 1024,
        "max_image_pixels": 1024 * 1024,
    }
    values.update(overrides)
    return ApiSettings(**values)


@pytest.fixture()
def migrated_url(database_url: str, tmp_path: Path) -> str:
    upgrade_head(make_settings(database_url, tmp_path))
    return database_url


@dataclass
class Api:
    """A running test app and helpers to act as tenants and workers."""

    client: TestClient
    settings: ApiSettings
    ledger: FakeLedger
    sender: RecordingSender
    store: LocalDirStore
    admin: str
    tokens: dict[str, str] = field(default_factory=dict)

    def tenant(self, name: str = "acme",
               scopes: tuple[Scope, ...] = (Scope.READ, Scope.SUBMIT, Scope.OWNER)
               ) -> tuple[str, str]:
        """Create a tenant via the admin endpoint; returns (tenant_id, token)."""
        r = self.client.post("/v1/tenants", json={"name": name, "scopes": list(scopes)},
                             headers=auth(self.admin))
        assert r.status_code == 201, r.text
        body = r.json()
        return body["tenant_id"], body["key"]["api_key"]

    def upload(self, token: str, data: bytes, metadata: dict[str, Any],
               filename: str = "data.zip") -> Any:
        return self.client.post("/v1/datasets", headers=auth(token),
                                files={"file": (filename, data, "application/octet-stream")},
                                data={"metadata": json.dumps(metadata)})

    def public_dataset(self, token: str, classes: dict[str, int] | None = None) -> str:
        r = self.upload(token, b.zip_bytes(b.image_folder(classes or {"a": 3, "b": 3})),
                        {"name": "pub", "visibility": "public"})
        assert r.status_code == 201, r.text
        return str(r.json()["dataset_id"])

    def private_dataset(self, token: str, *, n: int = 12, epsilon_limit: float = 10.0,
                        **meta: Any) -> str:
        size = {} if "size_epsilon" in meta else {"declared_size": n}  # N̂: the true count
        r = self.upload(token, b.digits_npz(n, k=3), {
            "name": "priv", "visibility": "private", "epsilon_limit": epsilon_limit,
            "label_domain": ["x", "y", "z"], **size, **meta}, filename="d.npz")
        assert r.status_code == 201, r.text
        return str(r.json()["dataset_id"])

    def model(self, token: str) -> str:
        r = self.client.post("/v1/models", headers=auth(token), files={
            "file": ("m.zip", b.zip_bytes(b.model_folder()), "application/zip")})
        assert r.status_code == 201, r.text
        return str(r.json()["model_id"])

    def finetune(self, token: str, dataset_id: str, model_id: str, *, epsilon: float = 1.0,
                 batch: int = 4, dry_run: bool = False) -> Any:
        spec = {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
                "privacy": {"target_epsilon": epsilon},
                "training": {"expected_batch_size": batch, "epochs": 2}}
        return self.client.post("/v1/jobs" + ("?dry_run=true" if dry_run else ""), json=spec,
                                headers=auth(token))

    def worker(self, path: str, body: dict[str, Any]) -> Any:
        return self.client.post(f"/internal/v1/jobs/{path}", json=body,
                                headers=auth(WORKER_TOKEN))


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def admin_token(settings: ApiSettings) -> str:
    engine = create_engine(settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            created: CreatedTenant = create_tenant(session, name="root",
                                                   scopes=sorted(ALL_SCOPES))
    finally:
        engine.dispose()
    return created.key.api_key


@pytest.fixture()
def make_api(migrated_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """A factory of started test apps (``make_api(lease_ttl_s=2, ...)``)."""
    clients: list[TestClient] = []

    def _make(**overrides: Any) -> Api:
        settings = make_settings(migrated_url, tmp_path, **overrides)
        ledger, sender = FakeLedger(), RecordingSender()
        store = LocalDirStore(tmp_path / "objects")
        app = create_app(settings, store=store, ledger=ledger, task_sender=sender)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return Api(client, settings, ledger, sender, store, admin_token(settings))

    yield _make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture()
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()


@contextmanager
def api_with_real_ledger(migrated_url: str, pg: Any,
                         tmp_path: Path) -> Iterator[tuple[Api, TestClient]]:
    """The api on its database and the real ledger app on another, joined over HTTP.

    Yields the api and the ledger's own test client (for reads the api does not proxy).
    """
    lset = ledger_settings(pg.url(pg.create_database()))
    upgrade_ledger(lset)
    with TestClient(create_ledger_app(lset)) as ledger_client:
        def forward(request: httpx.Request) -> httpx.Response:
            r = ledger_client.request(request.method, str(request.url.copy_with(
                scheme="http", host="testserver")), content=request.read(),
                headers=dict(request.headers))
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        ledger = HttpLedger("http://ledger", LEDGER_TOKEN, transport=httpx.MockTransport(forward))
        settings = make_settings(migrated_url, tmp_path)
        sender, store = RecordingSender(), LocalDirStore(tmp_path / "objects")
        app = create_app(settings, store=store, ledger=ledger, task_sender=sender)
        with TestClient(app, raise_server_exceptions=False) as client:
            yield (Api(client, settings, ledger, sender, store,  # type: ignore[arg-type]
                       admin_token(settings)), ledger_client)


@pytest.fixture()
def real_ledger_api(migrated_url: str, pg: Any, tmp_path: Path) -> Iterator[Api]:
    """The api joined to the real ledger (see :func:`api_with_real_ledger`)."""
    with api_with_real_ledger(migrated_url, pg, tmp_path) as (api_, _):
        yield api_
