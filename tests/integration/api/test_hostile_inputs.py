"""Hostile inputs are refused at the edge (issue 14, item 4).

NUL bytes (PostgreSQL refuses them in text and jsonb), control characters in names, an
epsilon the accountant cannot calibrate (1e-323) and counts past a 32-bit column used to
fail deep in a service: a 500 from the api, or a 503 from the api when the ledger failed.
Every case here must be a 4xx RFC 9457 problem with a stable ``code``, and the service
must answer normally afterwards. The api runs on the REAL ledger (both on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dpsynth_shared.errors import PROBLEM_CONTENT_TYPE
from fastapi.testclient import TestClient

from tests.integration.api.conftest import Api, api_with_real_ledger, auth
from tests.integration.ledger.conftest import AUTH as LEDGER_AUTH
from tests.integration.ledger.conftest import new_budget
from tests.unit.api import builders as b

NUL = "\x00"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, pg: Any) -> Iterator[dict[str, Any]]:
    """One api + ledger pair for the whole module (cases only read or are refused)."""
    from dpsynth_api.migrate import upgrade_head

    from tests.integration.api.conftest import make_settings

    tmp: Path = tmp_path_factory.mktemp("hostile")
    url = pg.url(pg.create_database())
    upgrade_head(make_settings(url, tmp))
    with api_with_real_ledger(url, pg, tmp) as (api, ledger_client):
        tenant, token = api.tenant("hostile")
        r = api.upload(token, b.digits_npz(12, k=3), {
            "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": ["x", "y", "z"], "declared_size": 12}, filename="d.npz")
        assert r.status_code == 201, r.text
        dataset = r.json()["dataset_id"]
        model = api.model(token)
        ledger_client.headers.update(LEDGER_AUTH)
        yield {"api": api, "ledger": ledger_client, "token": token, "dataset": dataset,
               "model": model, "tenant": tenant}


def _private_meta(**over: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "priv", "visibility": "private", "epsilon_limit": 10.0,
                            "label_domain": ["x", "y", "z"], "declared_size": 12}
    meta.update(over)
    return meta


def _spec(w: dict[str, Any], **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "finetune", "dataset_id": w["dataset"],
                            "base_model_id": w["model"],
                            "privacy": {"target_epsilon": 1.0},
                            "training": {"expected_batch_size": 4, "epochs": 2}}
    for key, value in over.items():
        if key in {"privacy", "training"}:
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


# (case id, request) -> each request is (method, path, kwargs) against the api.
def _api_cases(w: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    t, ds = w["token"], w["dataset"]
    h = auth(t)
    admin = auth(w["api"].admin)

    sizes = iter(range(9, 40))  # other pixels per upload: no overlap with another upload

    def upload(meta: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        data = b.digits_npz(12, k=3, size=next(sizes))
        return ("POST", "/v1/datasets", {
            "headers": h, "files": {"file": ("d.npz", data,
                                             "application/octet-stream")},
            "data": {"metadata": json.dumps(meta)}})

    def job(**over: Any) -> tuple[str, str, dict[str, Any]]:
        return ("POST", "/v1/jobs?dry_run=true", {"headers": h, "json": _spec(w, **over)})

    return {
        "dataset-name-nul": upload(_private_meta(name="a" + NUL + "b")),
        "dataset-name-newline": upload(_private_meta(name="a\nb")),
        "dataset-name-escape": upload(_private_meta(name="\x1b[31mred")),
        "label-domain-nul": upload(_private_meta(label_domain=["x", "y" + NUL, "z"])),
        "class-sizes-key-nul": upload(_private_meta(class_sizes={"x": 4, "y\x00": 4, "z": 4})),
        "subject-column-nul": upload(_private_meta(privacy_unit="subject",
                                                   subject_column="s" + NUL)),
        "size-epsilon-tiny": upload({k: v for k, v in _private_meta(
            size_epsilon=1e-323).items() if k != "declared_size"}),
        "declared-size-2^31": upload(_private_meta(declared_size=2**31)),
        # a DP count of the size at δ → 1 and a subnormal limit ran the ledger's one-shot
        # calibration for minutes (issue 14, items 1 and 4): the schema refuses both
        "size-epsilon-delta-near-one": upload({k: v for k, v in _private_meta(
            size_epsilon=0.001, delta=0.9999999999999999).items() if k != "declared_size"}),
        "size-epsilon-limit-subnormal": upload({k: v for k, v in _private_meta(
            size_epsilon=0.001, epsilon_limit=5e-324).items() if k != "declared_size"}),
        "epsilon-limit-subnormal": upload(_private_meta(epsilon_limit=5e-324)),
        "delta-subnormal": upload(_private_meta(delta=5e-324)),
        "tenant-name-nul": ("POST", "/v1/tenants", {"headers": admin, "json": {
            "name": "evil" + NUL}}),
        "tenant-name-control": ("POST", "/v1/tenants", {"headers": admin, "json": {
            "name": "evil\x07"}}),
        "key-name-nul": ("POST", f"/v1/tenants/{w['tenant']}/keys", {"headers": admin, "json": {
            "scopes": ["read"], "name": "k" + NUL}}),
        "path-id-nul-encoded": ("GET", "/v1/datasets/ds_%00abc", {"headers": h}),
        "path-id-nul-budget": ("GET", f"/v1/datasets/{ds}%00/budget", {"headers": h}),
        "path-id-nul-job": ("GET", "/v1/jobs/job_%00", {"headers": h}),
        "path-id-nul-model": ("GET", "/v1/models/mdl_%00", {"headers": h}),
        "query-nul": ("GET", "/v1/datasets?cursor=%00", {"headers": h}),
        "job-dataset-id-nul": job(dataset_id=ds + NUL),
        "job-base-model-nul": job(base_model_id=w["model"] + NUL),
        "job-class-map-nul": job(training={"class_map": {"x" + NUL: "a"}}),
        "job-epsilon-tiny": job(privacy={"target_epsilon": 1e-323}),
        "job-batch-2^31": job(training={"expected_batch_size": 2**31}),
        "job-seed-huge": job(seed=2**70),
        "class-size-release-eps-tiny": ("POST", f"/v1/datasets/{ds}/class-sizes/release", {
            "headers": h, "json": {"target_epsilon": 1e-323}}),
        "class-size-release-eps-tiny-dry": ("POST", f"/v1/datasets/{ds}/class-sizes/release",
                                            {"headers": h, "json": {
                                                "target_epsilon": 1e-323, "dry_run": True}}),
        "derive-name-nul": ("POST", f"/v1/datasets/{ds}/derive", {"headers": h, "json": {
            "name": "c" + NUL, "kind": "subset", "classes": ["x"]}}),
        "derive-class-nul": ("POST", f"/v1/datasets/{ds}/derive", {"headers": h, "json": {
            "name": "c", "kind": "subset", "classes": ["x" + NUL]}}),
    }


# Cases today's code already refused with a 4xx before this change (regression guards; every
# other case failed with a 500, or a 503 from the ledger).
GUARDS = {"declared-size-2^31", "query-nul", "class-sizes-key-nul", "subject-column-nul",
          "job-epsilon-tiny", "job-batch-2^31", "job-seed-huge", "derive-class-nul",
          "budget-declared-size-huge", "plan-epsilon-tiny", "plan-batch-2^31",
          "plan-population-huge"}

API_CASES = list(_api_cases({"token": "t", "dataset": "d", "model": "m", "tenant": "t",
                             "api": type("A", (), {"admin": "a"})()}))


def _assert_problem(r: Any, case: str) -> None:
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM_CONTENT_TYPE), (case, r.headers)
    body = r.json()
    assert isinstance(body.get("code"), str) and body["code"], (case, body)
    assert body["status"] == r.status_code, (case, body)


@pytest.mark.parametrize("case", API_CASES)
def test_api_refuses_hostile_input_with_a_4xx_problem(world: dict[str, Any], case: str) -> None:
    api: Api = world["api"]
    method, path, kwargs = _api_cases(world)[case]
    r = api.client.request(method, path, **kwargs)
    _assert_problem(r, case)
    # Healthy after: the dataset and its budget (read from the real ledger) answer.
    h = auth(world["token"])
    assert api.client.get(f"/v1/datasets/{world['dataset']}", headers=h).status_code == 200
    assert api.client.get(f"/v1/datasets/{world['dataset']}/budget",
                          headers=h).status_code == 200


def _ledger_cases(ds: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    budget = {"dataset_id": "ds_" + "1" * 32, "tenant_id": "ten_test", "epsilon_limit": 8.0,
              "delta": 1e-6, "declared_size": 100}
    plan = {"dataset_id": ds, "target_epsilon": 1.0, "expected_batch_size": 4, "steps": 10}
    return {
        "budget-partition-nul": ("POST", "/v1/budgets", {"json": {
            **budget, "partitions": ["x", "y" + NUL]}}),
        "budget-partition-control": ("POST", "/v1/budgets", {"json": {
            **budget, "partitions": ["x", "y\n"]}}),
        "budget-dataset-id-nul": ("POST", "/v1/budgets", {"json": {
            **budget, "dataset_id": "ds_" + NUL}}),
        "budget-tenant-id-nul": ("POST", "/v1/budgets", {"json": {
            **budget, "tenant_id": "ten_" + NUL}}),
        "budget-declared-size-huge": ("POST", "/v1/budgets", {"json": {
            **budget, "declared_size": 2**63}}),
        "plan-epsilon-tiny": ("POST", "/v1/plans", {"json": {**plan, "target_epsilon": 1e-323}}),
        "plan-batch-2^31": ("POST", "/v1/plans", {"json": {
            **plan, "expected_batch_size": 2**31}}),
        "plan-population-huge": ("POST", "/v1/plans", {"json": {
            **plan, "population_size": 2**63}}),
        "plan-dataset-id-nul": ("POST", "/v1/plans", {"json": {**plan, "dataset_id": NUL}}),
        "histogram-epsilon-tiny": ("POST", f"/v1/budgets/{ds}/histogram-releases", {"json": {
            "target_epsilon": 1e-323, "dry_run": True}}),
        "budget-path-nul": ("GET", "/v1/budgets/ds_%00", {}),
        "size-plan-delta-near-one": ("POST", "/v1/size-release-plans", {"json": {
            "epsilon_limit": 1.0, "delta": 0.9999999999999999, "target_epsilon": 0.001}}),
        "size-plan-limit-subnormal": ("POST", "/v1/size-release-plans", {"json": {
            "epsilon_limit": 5e-324, "delta": 1e-6, "target_epsilon": 0.001}}),
        "size-plan-both": ("POST", "/v1/size-release-plans", {"json": {
            "epsilon_limit": 5e-324, "delta": 0.9999999999999999, "target_epsilon": 0.001}}),
        "budget-delta-near-one": ("POST", "/v1/budgets", {"json": {
            **budget, "delta": 0.9999999999999999, "declared_size": 1}}),
        "budget-limit-subnormal": ("POST", "/v1/budgets", {"json": {
            **budget, "epsilon_limit": 5e-324}}),
        # Starlette's own errors are problems too (they were application/json or text)
        "malformed-json-body": ("POST", "/v1/plans", {
            "content": b'{"dataset_id": ', "headers": {"content-type": "application/json"}}),
        "non-utf8-json-body": ("POST", "/v1/plans", {  # Starlette's 400 "error parsing"
            "content": b'{"dataset_id": "\xff"}', "headers": {"content-type": "application/json"}}),
        "unknown-route": ("GET", "/v1/no-such-route", {}),
        "method-not-allowed": ("DELETE", "/v1/budgets", {}),
        "entries-query-nul": ("GET", "/v1/entries?dataset_id=%00", {}),
    }


LEDGER_CASES = list(_ledger_cases("d"))


@pytest.mark.parametrize("case", LEDGER_CASES)
def test_ledger_contract_refuses_hostile_input(world: dict[str, Any], case: str) -> None:
    ledger: TestClient = world["ledger"]
    ds = "ds_" + "2" * 32
    if ledger.get(f"/v1/budgets/{ds}").status_code == 404:
        new_budget(ledger, ds, declared_size=100, partitions=["x", "y"])
    method, path, kwargs = _ledger_cases(ds)[case]
    r = ledger.request(method, path, **kwargs)
    _assert_problem(r, case)
    assert ledger.get(f"/v1/budgets/{ds}").status_code == 200
    assert ledger.get("/v1/chain/verify").json()["ok"] is True
