"""Authentication, scopes, tenant isolation, credentials in URLs."""

from __future__ import annotations

from dpsynth_api.tenants.security import Scope

from tests.integration.api.conftest import Api, auth

PROBLEM = "application/problem+json"


def _problem(r, status: int, code: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["code"] == code and body["status"] == status
    return body  # type: ignore[no-any-return]


def test_missing_bad_and_revoked_keys_are_401(api: Api) -> None:
    _, token = api.tenant()
    _problem(api.client.get("/v1/datasets"), 401, "unauthenticated")
    _problem(api.client.get("/v1/datasets", headers=auth("dps_garbage")), 401, "unauthenticated")
    wrong_secret = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    _problem(api.client.get("/v1/datasets", headers=auth(wrong_secret)), 401, "unauthenticated")
    assert api.client.get("/v1/datasets", headers=auth(token)).status_code == 200
    key_id = token[len("dps_"):].rsplit("_", 1)[0]
    r = api.client.post(f"/v1/keys/{key_id}/revoke", headers=auth(api.admin))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    _problem(api.client.get("/v1/datasets", headers=auth(token)), 401, "unauthenticated")


def test_key_in_query_string_is_refused(api: Api) -> None:
    _, token = api.tenant()
    for name in ("api_key", "key", "token", "access_token"):
        body = _problem(api.client.get(f"/v1/datasets?{name}={token}"), 400,
                        "api_key_in_query_string")
        assert token not in body["detail"]
    _problem(api.client.get("/v1/datasets?api_key=x", headers=auth(token)), 400,
             "api_key_in_query_string")


def test_scopes(api: Api) -> None:
    tenant_id, _ = api.tenant()
    r = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["read"]},
                        headers=auth(api.admin))
    assert r.status_code == 201 and r.json()["scopes"] == ["read"]
    reader = r.json()["api_key"]
    assert api.client.get("/v1/jobs", headers=auth(reader)).status_code == 200
    body = _problem(api.client.post("/v1/jobs", json={"type": "generate", "model_id": "x"},
                                    headers=auth(reader)), 403, "forbidden")
    assert body["required_scope"] == "submit"
    _problem(api.client.post("/v1/tenants", json={"name": "x"}, headers=auth(reader)), 403,
             "forbidden")


def test_submit_key_sees_no_true_count(api: Api) -> None:
    tenant_id, owner = api.tenant()
    ds = api.private_dataset(owner)
    r = api.client.post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["submit"]},
                        headers=auth(api.admin))
    submitter = r.json()["api_key"]
    seen = api.client.get(f"/v1/datasets/{ds}", headers=auth(submitter)).json()
    assert seen["true_size"] is None and seen["class_counts"] is None
    assert seen["declared_size"] == 12
    full = api.client.get(f"/v1/datasets/{ds}", headers=auth(owner)).json()
    assert full["true_size"] == 12 and full["class_counts"] == {"x": 4, "y": 4, "z": 4}


def test_other_tenants_resources_are_404(api: Api) -> None:
    _, alice = api.tenant("alice")
    _, bob = api.tenant("bob")
    ds = api.public_dataset(alice)
    model = api.model(alice)
    job = api.client.post("/v1/jobs", json={"type": "generate", "model_id": model},
                          headers=auth(alice)).json()["job_id"]
    r = api.worker(f"{job}/claim", {"attempt": 1, "worker_id": "w"})
    assert r.status_code == 200
    art = api.worker(f"{job}/artifacts", {"attempt": 1, "kind": "corpus",
                                          "object_key": f"corpora/{job}/corpus.zip",
                                          "sha256": "0" * 64, "size": 1}).json()["artifact_id"]
    for path in (f"/v1/datasets/{ds}", f"/v1/models/{model}", f"/v1/jobs/{job}",
                 f"/v1/artifacts/{art}", f"/v1/jobs/{job}/artifacts",
                 "/v1/datasets/ds_00000000000000000000000000000000"):
        _problem(api.client.get(path, headers=auth(bob)), 404, "not_found")
        if "0000" not in path:
            assert api.client.get(path, headers=auth(alice)).status_code == 200
    _problem(api.client.post(f"/v1/jobs/{job}/cancel", headers=auth(bob)), 404, "not_found")
    spec = {"type": "pretrain", "dataset_id": ds}
    _problem(api.client.post("/v1/jobs", json=spec, headers=auth(bob)), 404, "not_found")


def test_worker_endpoints_need_the_worker_token(api: Api) -> None:
    _, token = api.tenant()
    for headers in ({}, auth(token)):
        r = api.client.post("/internal/v1/jobs/job_x/claim",
                            json={"attempt": 1, "worker_id": "w"}, headers=headers)
        _problem(r, 401, "unauthenticated")


def test_unknown_route_and_method_are_problems(api: Api) -> None:
    _problem(api.client.get("/v1/nothing"), 404, "not_found")
    r = api.client.delete("/healthz")
    assert r.status_code == 405 and r.headers["content-type"].startswith(PROBLEM)


def test_scope_names(api: Api) -> None:
    assert {s.value for s in Scope} == {"read", "submit", "owner", "admin"}
