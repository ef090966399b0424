"""Hostile requests: headers, bodies, queries and paths (issue 14, "What it must show").

The second part of the hostile-input suite (tests/integration/api/test_hostile_inputs.py has
the values that reach SQL or the accountant, test_hostile_archives.py the archives): a
malformed Authorization header, JSON that is deep, huge, not UTF-8 or not finite, lone
surrogates (PostgreSQL cannot store them), broken multipart bodies, out-of-range paging and
ids. Each must be a 4xx RFC 9457 problem with a stable ``code`` within a bounded time, and
the api must answer normally afterwards. The api runs on the REAL ledger (both on
PostgreSQL).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dpsynth_shared.errors import PROBLEM_CONTENT_TYPE

from tests.integration.api.conftest import Api, api_with_real_ledger, auth
from tests.unit.api import builders as b

# Seconds any one hostile request may take (they are all refused before any real work).
BOUND_S = 10.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, pg: Any) -> Iterator[dict[str, Any]]:
    """One api + ledger pair for the whole module (cases only read or are refused)."""
    from dpsynth_api.migrate import upgrade_head

    from tests.integration.api.conftest import make_settings

    tmp: Path = tmp_path_factory.mktemp("hostile-requests")
    url = pg.url(pg.create_database())
    upgrade_head(make_settings(url, tmp))
    with api_with_real_ledger(url, pg, tmp) as (api, _ledger):
        _tenant, token = api.tenant("hostile-requests")
        r = api.upload(token, b.digits_npz(12, k=3), {
            "name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": ["x", "y", "z"], "declared_size": 12}, filename="d.npz")
        assert r.status_code == 201, r.text
        yield {"api": api, "token": token, "dataset": r.json()["dataset_id"],
               "model": api.model(token)}


def _deep(depth: int) -> str:
    return '{"type": "finetune", "x": ' + "[" * depth + "]" * depth + "}"


def _cases(w: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    token, ds = w["token"], w["dataset"]
    h = auth(token)
    jh = {**h, "content-type": "application/json"}
    spec = {"type": "finetune", "dataset_id": ds, "base_model_id": w["model"],
            "privacy": {"target_epsilon": 1.0},
            "training": {"expected_batch_size": 4, "epochs": 2}}
    meta = {"name": "priv", "visibility": "private", "epsilon_limit": 10.0,
            "label_domain": ["x", "y", "z"], "declared_size": 12}

    def raw_job(content: bytes, headers: dict[str, str] | None = None
                ) -> tuple[str, str, dict[str, Any]]:
        return ("POST", "/v1/jobs?dry_run=true", {"headers": headers or jh,
                                                  "content": content})

    def upload(metadata: str, *, filename: str = "d.npz", data: bytes | None = None,
               ) -> tuple[str, str, dict[str, Any]]:
        body = b.digits_npz(12, k=3, size=41) if data is None else data
        return ("POST", "/v1/datasets", {
            "headers": h, "files": {"file": (filename, body, "application/octet-stream")},
            "data": {"metadata": metadata}})

    return {
        # Authorization
        "auth-basic-scheme": ("GET", "/v1/datasets", {"headers": {
            "authorization": "Basic dXNlcjpwYXNz"}}),
        "auth-bearer-empty": ("GET", "/v1/datasets", {"headers": {"authorization": "Bearer "}}),
        "auth-bearer-64k": ("GET", "/v1/datasets", {"headers": {
            "authorization": "Bearer dps_" + "a" * 65536}}),
        "auth-bearer-latin1": ("GET", "/v1/datasets", {"headers": {
            "authorization": "Bearer dps_\xe9\xe9".encode("latin-1")}}),
        "auth-bearer-control": ("GET", "/v1/datasets", {"headers": {
            "authorization": "Bearer dps_\x07\x1b"}}),
        "auth-no-header": ("POST", "/v1/jobs?dry_run=true", {"json": spec}),
        # JSON bodies
        "json-malformed": raw_job(b'{"type": "finetune",'),
        "json-not-object": raw_job(b"[1, 2, 3]"),
        "json-deep-nesting": raw_job(_deep(100_000).encode()),
        "json-number-overflow": raw_job(json.dumps(spec).replace(
            '"target_epsilon": 1.0', '"target_epsilon": 1e400').encode()),
        "json-nan": raw_job(json.dumps(spec).replace(
            '"target_epsilon": 1.0', '"target_epsilon": NaN').encode()),
        "json-invalid-utf8": raw_job(b'{"type": "finetune", "dataset_id": "\xff\xfe"}'),
        "json-lone-surrogate-id": raw_job(json.dumps(spec).replace(
            f'"{ds}"', '"ds_\\ud800"').encode()),
        "json-text-plain": raw_job(json.dumps(spec).encode(), {**h, "content-type": "text/plain"}),
        "json-huge-string": raw_job(json.dumps({**spec, "dataset_id": "d" * (16 << 20)}).encode()),
        "json-unknown-type": ("POST", "/v1/jobs?dry_run=true", {"headers": h, "json": {
            **spec, "type": "exfiltrate"}}),
        "json-extra-field": ("POST", "/v1/jobs?dry_run=true", {"headers": h, "json": {
            **spec, "callback_url": "http://evil.example"}}),
        "tenant-name-lone-surrogate": ("POST", "/v1/tenants", {
            "headers": {**auth(w["api"].admin), "content-type": "application/json"},
            "content": b'{"name": "evil\\udfff"}'}),
        # Multipart uploads
        "upload-no-file": ("POST", "/v1/datasets", {"headers": h, "data": {
            "metadata": json.dumps(meta)}}),
        "upload-no-metadata": ("POST", "/v1/datasets", {"headers": h, "files": {
            "file": ("d.npz", b.digits_npz(12, k=3, size=42), "application/octet-stream")}}),
        "upload-metadata-malformed": upload("{"),
        "upload-metadata-array": upload("[]"),
        "upload-metadata-lone-surrogate": upload(json.dumps(meta).replace(
            '"priv"', '"pr\\ud800iv"')),
        "upload-metadata-deep": upload(_deep(100_000)),
        "upload-empty-file": upload(json.dumps(meta), data=b""),
        "upload-not-an-archive": upload(json.dumps(meta), data=b"\x89junk" * 4096),
        "upload-no-boundary": ("POST", "/v1/datasets", {"headers": {
            **h, "content-type": "multipart/form-data"}, "content": b"--x\r\n\r\n--x--\r\n"}),
        "upload-garbage-multipart": ("POST", "/v1/datasets", {"headers": {
            **h, "content-type": "multipart/form-data; boundary=zz"},
            "content": b"\x00\x01garbage" * 1000}),
        # Queries, paths and methods
        "query-limit-negative": ("GET", "/v1/datasets?limit=-1", {"headers": h}),
        "query-limit-huge": ("GET", f"/v1/datasets?limit={10**12}", {"headers": h}),
        "query-cursor-garbage": ("GET", "/v1/datasets?cursor=!!!not-a-cursor", {"headers": h}),
        "query-cursor-huge": ("GET", "/v1/jobs?cursor=" + "A" * 30_000, {"headers": h}),
        "query-lone-surrogate": ("GET", "/v1/datasets?cursor=%ED%A0%80", {"headers": h}),
        "path-id-10k": ("GET", "/v1/datasets/ds_" + "a" * 10_000, {"headers": h}),
        "path-traversal": ("GET", "/v1/datasets/..%2f..%2fetc%2fpasswd", {"headers": h}),
        "path-unknown": ("GET", "/v1/no-such-thing", {"headers": h}),
        "method-not-allowed": ("DELETE", "/v1/datasets", {"headers": h}),
        "accept-xml-not-found": ("GET", "/v1/jobs/job_missing", {"headers": {
            **h, "accept": "application/xml"}}),
    }


CASES = list(_cases({"token": "t", "dataset": "d", "model": "m",
                     "api": type("A", (), {"admin": "a"})()}))


@pytest.mark.parametrize("case", CASES)
def test_api_refuses_hostile_request_with_a_4xx_problem(world: dict[str, Any],
                                                        case: str) -> None:
    api: Api = world["api"]
    method, path, kwargs = _cases(world)[case]
    started = time.monotonic()
    r = api.client.request(method, path, **kwargs)
    elapsed = time.monotonic() - started
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith(PROBLEM_CONTENT_TYPE), (case, r.headers)
    body = r.json()
    assert isinstance(body.get("code"), str) and body["code"], (case, body)
    assert body["status"] == r.status_code, (case, body)
    assert elapsed < BOUND_S, (case, elapsed)
    # Healthy after: the dataset and its budget (read from the real ledger) answer.
    h = auth(world["token"])
    assert api.client.get(f"/v1/datasets/{world['dataset']}", headers=h).status_code == 200
    assert api.client.get(f"/v1/datasets/{world['dataset']}/budget",
                          headers=h).status_code == 200
