"""The Python client against an in-process fake api (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from dpsynth_client import ApiError, Client
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.unit.cli.fake_api import FakeApi, problem


@pytest.fixture()
def api() -> FakeApi:
    return FakeApi()


def make(api: FakeApi, key: str | None = None) -> Client:
    return Client("http://api.test/", key or api.key, transport=api.transport())


def test_key_goes_in_the_bearer_header_never_the_query(api: FakeApi) -> None:
    api.route("GET", "/v1/datasets/ds_1", {"id": "ds_1"})
    assert make(api).get_dataset("ds_1") == {"id": "ds_1"}
    request = api.requests[-1]
    assert request.headers["authorization"] == "Bearer dps_test_key"
    assert api.key not in str(request.url)


def test_problem_json_becomes_dpsynth_error_with_status_and_numbers(api: FakeApi) -> None:
    api.route("POST", "/v1/jobs", lambda r: problem(
        409, "privacy_budget_exhausted", "no budget left", max_admissible_target_epsilon=0.42))
    with pytest.raises(DpsynthError) as excinfo:
        make(api).submit_job({"type": "finetune"})
    err = excinfo.value
    assert isinstance(err, ApiError)
    assert err.code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED
    assert err.status == 409
    assert err.detail == "no budget left"
    assert err.extensions["max_admissible_target_epsilon"] == 0.42


def test_unknown_code_keeps_the_server_status(api: FakeApi) -> None:
    api.route("GET", "/v1/models/m", lambda r: problem(418, "brand_new_code", "teapot"))
    with pytest.raises(DpsynthError) as excinfo:
        make(api).get_model("m")
    assert (excinfo.value.code, excinfo.value.status) == ("brand_new_code", 418)


def test_wrong_key_is_unauthenticated(api: FakeApi) -> None:
    with pytest.raises(DpsynthError) as excinfo:
        make(api, key="wrong").list_datasets()
    assert (excinfo.value.code, excinfo.value.status) == (ErrorCode.UNAUTHENTICATED, 401)


def test_non_json_5xx_is_service_unavailable(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs/j", lambda r: httpx.Response(502, text="<html>bad gateway"))
    with pytest.raises(DpsynthError) as excinfo:
        make(api).get_job("j")
    assert (excinfo.value.code, excinfo.value.status) == (ErrorCode.SERVICE_UNAVAILABLE, 502)


def test_unreachable_api_is_service_unavailable() -> None:
    client = Client("http://127.0.0.1:9", "k", timeout=2)
    with pytest.raises(DpsynthError) as excinfo:
        client.healthz()
    assert excinfo.value.code == ErrorCode.SERVICE_UNAVAILABLE
    assert excinfo.value.status == 503


def test_dry_run_is_a_query_flag_and_spec_the_body(api: FakeApi) -> None:
    api.route("POST", "/v1/jobs",
              lambda r: httpx.Response(200, json={"plan": json.loads(r.content)}))
    result = make(api).submit_job({"type": "generate", "model_id": "m"}, dry_run=True)
    assert result == {"plan": {"type": "generate", "model_id": "m"}}
    assert api.requests[-1].url.params["dry_run"] == "true"


def test_list_jobs_follows_cursors(api: FakeApi) -> None:
    pages = {None: ({"items": [{"id": "j1"}, {"id": "j2"}], "next_cursor": "c2"}),
             "c2": ({"items": [{"id": "j3"}], "next_cursor": None})}
    api.route("GET", "/v1/jobs",
              lambda r: httpx.Response(200, json=pages[r.url.params.get("cursor")]))
    ids = [job["id"] for job in make(api).list_jobs(page_size=2)]
    assert ids == ["j1", "j2", "j3"]
    assert [r.url.params["limit"] for r in api.requests] == ["2", "2"]


def test_upload_dataset_sends_file_and_metadata_json(api: FakeApi, tmp_path: Path) -> None:
    data = tmp_path / "digits.npz"
    data.write_bytes(b"NPZ-BYTES")
    seen: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.content
        seen["has_file"] = b"NPZ-BYTES" in body and b'name="file"' in body
        start = body.index(b'name="metadata"')
        chunk = body[start:].split(b"\r\n\r\n", 1)[1].split(b"\r\n--", 1)[0]
        seen["metadata"] = json.loads(chunk)
        return httpx.Response(201, json={"id": "ds_9"})

    api.route("POST", "/v1/datasets", handler)
    out = make(api).upload_dataset(data, name="d", visibility="private", epsilon_limit=8.0,
                                   label_domain=["0", "1"])
    assert out == {"id": "ds_9"}
    assert seen["has_file"] is True
    assert seen["metadata"] == {"name": "d", "visibility": "private", "epsilon_limit": 8.0,
                                "label_domain": ["0", "1"]}


def test_download_streams_to_dest_atomically(api: FakeApi, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 5000
    api.route("GET", "/v1/artifacts/a1/download",
              lambda r: httpx.Response(200, content=payload,
                                       headers={"content-length": str(len(payload))}))
    progress: list[tuple[int, int | None]] = []
    dest = make(api).download_artifact("a1", tmp_path / "sub" / "corpus.zip",
                                       on_chunk=lambda d, t: progress.append((d, t)))
    assert dest.read_bytes() == payload
    assert progress[-1] == (len(payload), len(payload))
    assert [p.name for p in dest.parent.iterdir()] == ["corpus.zip"]


def test_failed_download_leaves_no_file(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", "/v1/artifacts/a2/download",
              lambda r: problem(403, "presign_refused", "no"))
    with pytest.raises(DpsynthError) as excinfo:
        make(api).download_artifact("a2", tmp_path / "x.zip")
    assert excinfo.value.code == ErrorCode.PRESIGN_REFUSED
    assert list(tmp_path.iterdir()) == []


def test_presign_asks_for_json(api: FakeApi) -> None:
    api.route("GET", "/v1/artifacts/a3/download",
              lambda r: httpx.Response(200, json={"url": "http://s3/x", "expires_at": "t"}))
    assert make(api).presign_artifact("a3")["url"] == "http://s3/x"
    assert api.requests[-1].url.params["presign"] == "true"


def test_wait_for_job_reports_progress_until_terminal(api: FakeApi) -> None:
    states = iter([{"state": "queued"}, {"state": "running", "progress": {"step": 5}},
                   {"state": "succeeded", "result": {"model_id": "m"}}])
    api.route("GET", "/v1/jobs/j1", lambda r: httpx.Response(200, json=next(states)))
    seen: list[str] = []
    job = make(api).wait_for_job("j1", timeout=10, poll=0.0,
                                 on_progress=lambda j: seen.append(j["state"]))
    assert job["result"] == {"model_id": "m"}
    assert seen == ["queued", "running", "succeeded"]


def test_wait_for_job_times_out(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs/j2", {"state": "running"})
    with pytest.raises(TimeoutError):
        make(api).wait_for_job("j2", timeout=0.05, poll=0.01)


def test_admin_calls_hit_documented_paths(api: FakeApi) -> None:
    api.route("POST", "/v1/tenants", lambda r: httpx.Response(201, json=json.loads(r.content)))
    api.route("POST", "/v1/tenants/t1/keys",
              lambda r: httpx.Response(201, json=json.loads(r.content)))
    api.route("POST", "/v1/keys/k1/revoke", {"key_id": "k1", "revoked_at": "now"})
    client = make(api)
    assert client.create_tenant("acme") == {"name": "acme"}
    assert client.create_key("t1", ["read"]) == {"scopes": ["read"]}
    assert client.revoke_key("k1")["revoked_at"] == "now"


def test_list_datasets_and_models_read_every_page(api: FakeApi) -> None:
    def pager(prefix: str):  # type: ignore[no-untyped-def]
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.params.get("cursor") == "p2":
                return httpx.Response(200, json={"items": [{"id": f"{prefix}3"}],
                                                 "next_cursor": None})
            return httpx.Response(200, json={"items": [{"id": f"{prefix}1"}, {"id": f"{prefix}2"}],
                                             "next_cursor": "p2"})
        return handler

    api.route("GET", "/v1/datasets", pager("ds"))
    api.route("GET", "/v1/models", pager("m"))
    client = make(api)
    assert [d["id"] for d in client.list_datasets()] == ["ds1", "ds2", "ds3"]
    assert [m["id"] for m in client.list_models()] == ["m1", "m2", "m3"]
