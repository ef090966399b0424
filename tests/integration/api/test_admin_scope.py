"""Platform administration apart from tenant ownership (issue 14, item 6).

The attack: a tenant created with the admin scope minted an owner key for another tenant,
read its private dataset with it and revoked its key. Only the platform's admin tenant
(``tenants.is_admin``) may hold a platform scope; a tenant's owner administers its own keys;
every administrative action leaves a JSON audit line in the api's log (and, for the ledger's
admin path, in the ledger's). Real PostgreSQL; the real ledger where its log is checked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from dpsynth_api.tables import ApiKey
from dpsynth_api.tenants.security import generate_key, hash_secret, parse_token
from dpsynth_shared.logging import JsonFormatter
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from tests.integration.api.conftest import Api, api_with_real_ledger, auth

PROBLEM = "application/problem+json"


def _problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["code"] == code
    return body


def _key_id(token: str) -> str:
    parsed = parse_token(token)
    assert parsed is not None
    return parsed[0]


def _insert_key(api: Api, tenant_id: str, scopes: list[str]) -> str:
    """A key row written straight into the database, as one granted before the fix was."""
    new = generate_key()
    engine = create_engine(api.settings.database.url)
    try:
        with Session(engine) as session:
            session.add(ApiKey(id=new.key_id, tenant_id=tenant_id, scopes=scopes,
                               secret_sha256=hash_secret(new.secret), name="old admin key"))
            session.commit()
    finally:
        engine.dispose()
    return new.token


def _admin_tenant_id(api: Api) -> str:
    engine = create_engine(api.settings.database.url)
    try:
        with Session(engine) as session:
            key = session.get(ApiKey, _key_id(api.admin))
            assert key is not None
            return key.tenant_id
    finally:
        engine.dispose()


def _audit_lines(caplog: pytest.LogCaptureFixture, logger: str,
                 service: str) -> list[dict[str, Any]]:
    """The audit records as the service's JSON log lines (its formatter, parsed back)."""
    formatter = JsonFormatter(service)
    lines = [formatter.format(r) for r in caplog.records if r.name == logger]
    return [json.loads(line) | {"_line": line} for line in lines]


def test_no_tenant_but_the_platforms_gets_a_platform_scope(api: Api) -> None:
    for scopes in (["admin"], ["read", "submit", "owner", "admin"]):
        body = _problem(api.client.post("/v1/tenants", json={"name": "t", "scopes": scopes},
                                        headers=auth(api.admin)), 403,
                        "platform_scope_refused")
        assert body["refused_scopes"] == ["admin"]
    tenant_id, owner = api.tenant("t")
    for token in (api.admin, owner):  # neither the platform admin nor the tenant's owner
        _problem(api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["admin"]},
                                 headers=auth(token)), 403, "platform_scope_refused")
    # the platform's own tenant may get another admin key (a rotation), from an admin key only
    admin_tenant = _admin_tenant_id(api)
    r = api.client.post(f"/v1/tenants/{admin_tenant}/keys", json={"scopes": ["admin"]},
                        headers=auth(api.admin))
    assert r.status_code == 201 and r.json()["scopes"] == ["admin"], r.text
    rotated = r.json()["api_key"]
    assert api.client.get("/v1/admin/ledger/anchor", headers=auth(rotated)).status_code == 200
    r = api.client.post(f"/v1/tenants/{admin_tenant}/keys", json={"scopes": ["owner"]},
                        headers=auth(api.admin))
    admin_tenants_owner = r.json()["api_key"]
    _problem(api.client.post(f"/v1/tenants/{admin_tenant}/keys", json={"scopes": ["admin"]},
                             headers=auth(admin_tenants_owner)), 403, "platform_scope_refused")


def test_an_old_admin_scope_on_a_tenant_key_grants_nothing(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    victim, victim_owner = api.tenant("victim")
    dataset = api.private_dataset(victim_owner)
    spare = api.client.post(f"/v1/tenants/{victim}/keys", json={"scopes": ["read"]},
                            headers=auth(api.admin)).json()
    attacker, _ = api.tenant("attacker")
    admin_only = _insert_key(api, attacker, ["admin"])
    full = _insert_key(api, attacker, ["admin", "owner", "read", "submit"])
    caplog.set_level(logging.WARNING, logger="dpsynth_api.tenants.service")
    # admin scope ignored, nothing else: every administrative endpoint is 403
    for method, path, body in (
            ("POST", f"/v1/tenants/{victim}/keys", {"scopes": ["owner"]}),
            ("POST", f"/v1/keys/{spare['key_id']}/revoke", None),
            ("POST", "/v1/tenants", {"name": "mine"}),
            ("PUT", f"/v1/admin/tenants/{victim}/policy", {"max_dataset_epsilon_limit": 1}),
            ("POST", "/v1/admin/ledger/reconcile", None),
            ("GET", "/v1/admin/ledger/anchor", None)):
        _problem(api.client.request(method, path, json=body, headers=auth(admin_only)), 403,
                 "forbidden")
    # admin scope ignored, the tenant scopes act in the attacker's tenant only
    _problem(api.client.post(f"/v1/tenants/{victim}/keys", json={"scopes": ["owner"]},
                             headers=auth(full)), 404, "not_found")
    _problem(api.client.post(f"/v1/keys/{spare['key_id']}/revoke", headers=auth(full)), 404,
             "not_found")
    _problem(api.client.get(f"/v1/datasets/{dataset}", headers=auth(full)), 404, "not_found")
    _problem(api.client.post("/v1/admin/ledger/reconcile", headers=auth(full)), 403,
             "forbidden")
    _problem(api.client.post("/v1/tenants", json={"name": "mine"}, headers=auth(full)), 403,
             "forbidden")
    assert api.ledger.reconciled == []
    assert api.client.get(f"/v1/datasets/{dataset}",
                          headers=auth(spare["api_key"])).status_code == 200  # not revoked
    warned = {getattr(r, "key_id", None) for r in caplog.records
              if "ignored the platform scopes" in r.message}
    assert warned == {_key_id(admin_only), _key_id(full)}


def test_a_tenant_owner_manages_its_own_keys_only(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    alice, alice_owner = api.tenant("alice")
    bob, bob_owner = api.tenant("bob")
    caplog.set_level(logging.INFO, logger="dpsynth_api.audit")
    r = api.client.post(f"/v1/tenants/{alice}/keys", json={"scopes": ["read"], "name": "ci"},
                        headers=auth(alice_owner))
    assert r.status_code == 201 and r.json()["tenant_id"] == alice, r.text
    reader = r.json()
    assert api.client.get("/v1/datasets", headers=auth(reader["api_key"])).status_code == 200
    body = _problem(api.client.post(f"/v1/tenants/{alice}/keys", json={"scopes": ["read"]},
                                    headers=auth(reader["api_key"])), 403, "forbidden")
    assert body["required_scope"] == "owner"
    _problem(api.client.post(f"/v1/keys/{_key_id(bob_owner)}/revoke",
                             headers=auth(reader["api_key"])), 403, "forbidden")
    # another tenant's ids answer like missing ones
    unknown = "ten_00000000000000000000000000000000"
    for tenant in (bob, unknown):
        _problem(api.client.post(f"/v1/tenants/{tenant}/keys", json={"scopes": ["read"]},
                                 headers=auth(alice_owner)), 404, "not_found")
    for key in (_key_id(bob_owner), "key_00000000000000000000000000000000"):
        _problem(api.client.post(f"/v1/keys/{key}/revoke", headers=auth(alice_owner)), 404,
                 "not_found")
    assert api.client.get("/v1/datasets", headers=auth(bob_owner)).status_code == 200
    r = api.client.post(f"/v1/keys/{reader['key_id']}/revoke", headers=auth(alice_owner))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    _problem(api.client.get("/v1/datasets", headers=auth(reader["api_key"])), 401,
             "unauthenticated")
    lines = _audit_lines(caplog, "dpsynth_api.audit", "api")
    crossing = [(x["action"], x["target_tenant_id"], x["outcome"]) for x in lines
                if x["cross_tenant"]]
    assert crossing == [("key.create", bob, "not_found"), ("key.create", unknown, "not_found"),
                        ("key.revoke", bob, "not_found"), ("key.revoke", None, "not_found")]
    assert all(x["actor_tenant_id"] == alice for x in lines)


def test_platform_admin_tasks_work_and_are_audited(
        migrated_url: str, pg: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dpsynth_api.audit")
    caplog.set_level(logging.INFO, logger="dpsynth_ledger.audit")
    with api_with_real_ledger(migrated_url, pg, tmp_path) as (api, ledger_client):
        admin = auth(api.admin)
        r = api.client.post("/v1/tenants", json={"name": "acme"}, headers=admin)
        assert r.status_code == 201, r.text
        tenant, first = r.json()["tenant_id"], r.json()["key"]
        r = api.client.post(f"/v1/tenants/{tenant}/keys", json={"scopes": ["owner"]},
                            headers=admin)
        assert r.status_code == 201, r.text
        minted = r.json()
        assert api.client.post(f"/v1/keys/{first['key_id']}/revoke",
                               headers=admin).json()["revoked_at"] is not None
        r = api.client.put(f"/v1/admin/tenants/{tenant}/policy",
                           json={"max_dataset_epsilon_limit": 2.0}, headers=admin)
        assert r.status_code == 200, r.text
        r = api.client.post("/v1/admin/ledger/reconcile", headers=admin)
        assert r.status_code == 200 and r.json()["ok"] is True, r.text
        refused = ledger_client.post("/v1/admin/reconcile", json={"api_jobs": []},
                                     headers=auth("not-a-service-token"))
        assert refused.status_code == 401
    admin_key = _key_id(api.admin)
    lines = _audit_lines(caplog, "dpsynth_api.audit", "api")
    assert [(x["action"], x["target_tenant_id"], x["outcome"]) for x in lines] == [
        ("tenant.create", tenant, "ok"), ("key.create", tenant, "ok"),
        ("key.revoke", tenant, "ok"), ("tenant.policy.set", tenant, "ok"),
        ("ledger.reconcile", "*", "ok")]
    for x in lines:
        assert x["actor_key_id"] == admin_key and x["cross_tenant"] is True
        assert x["service"] == "api" and x["audit"] is True
    assert lines[0]["key_id"] == first["key_id"] and lines[1]["key_id"] == minted["key_id"]
    assert lines[2]["key_id"] == first["key_id"]
    ledger_lines = _audit_lines(caplog, "dpsynth_ledger.audit", "ledger")
    assert [(x["action"], x["outcome"], x["service_token_index"]) for x in ledger_lines] == [
        ("POST /v1/admin/reconcile", "ok", 0),
        ("POST /v1/admin/reconcile", "unauthenticated", None)]
    tokens = [api.admin, first["api_key"], minted["api_key"]]
    secrets = tokens + [t.rsplit("_", 1)[1] for t in tokens]
    for x in lines + ledger_lines:
        assert not any(s in x["_line"] for s in secrets)
