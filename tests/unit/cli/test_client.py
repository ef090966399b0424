"""The Python client against an in-process fake api (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from dpsynth_client import ApiError, Client, JobFailed, NotConfigured
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


# -- Client.from_env and submit_and_wait (issue 15, item 11) ------------------------------
def _credentials(folder: Path, url: str, key: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "credentials.json").write_text(json.dumps({"api_url": url, "api_key": key}))
    return folder


@pytest.fixture()
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No DPSYNTH_* variable, a per-user state folder of the test's own; returns it."""
    for name in ("DPSYNTH_API_URL", "DPSYNTH_API_KEY", "DPSYNTH_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def test_from_env_reads_the_credentials_of_the_project_above(
        api: FakeApi, tmp_path: Path, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _credentials(tmp_path / "proj" / ".dpsynth", "http://api.test", api.key)
    (tmp_path / "proj" / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "proj" / "notebooks")
    api.route("GET", "/v1/datasets", {"items": [{"dataset_id": "ds_1"}], "next_cursor": None})
    with Client.from_env(transport=api.transport()) as client:
        assert client.base_url == "http://api.test"
        assert client.config is not None and client.config.home == home
        assert client.config.key_source == str(home / "credentials.json")
        assert [d["dataset_id"] for d in client.list_datasets()] == ["ds_1"]


def test_from_env_precedence_arguments_then_env_then_file(
        tmp_path: Path, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _credentials(tmp_path / "h", "http://file:1", "file-key")
    monkeypatch.setenv("DPSYNTH_API_URL", "http://env:2")
    client = Client.from_env(home)
    assert (client.base_url, client.config and client.config.key_source) == (
        "http://env:2", str(home / "credentials.json"))
    monkeypatch.setenv("DPSYNTH_API_KEY", "env-key")
    monkeypatch.setenv("DPSYNTH_HOME", str(tmp_path / "nothing-here"))
    client = Client.from_env(api_url="http://arg:3")
    assert client.config is not None
    assert (client.base_url, client.config.url_source, client.config.key_source) == (
        "http://arg:3", "--api-url", "DPSYNTH_API_KEY")
    assert client._http.headers["authorization"] == "Bearer env-key"


def test_from_env_without_anything_is_not_configured(
        tmp_path: Path, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_HOME", str(tmp_path / "empty"))
    with pytest.raises(NotConfigured, match=r"no api URL: .* does not exist; start a platform"):
        Client.from_env()


def test_unreachable_platform_names_its_credentials_file(tmp_path: Path,
                                                         clean_env: Path) -> None:
    home = _credentials(tmp_path / "h", "http://127.0.0.1:9", "k")
    with pytest.raises(DpsynthError) as excinfo:
        Client.from_env(home, timeout=2).healthz()
    assert excinfo.value.code == ErrorCode.SERVICE_UNAVAILABLE
    assert f"the URL is from {home / 'credentials.json'}: is that platform running?" \
        in excinfo.value.detail
    assert f"`dpsynth up --home {home}` starts it" in excinfo.value.detail


def _job_api(api: FakeApi, states: list[dict[str, object]]) -> list[dict[str, object]]:
    """POST /v1/jobs answers j1 queued; each GET answers the next of ``states``."""
    submitted: list[dict[str, object]] = []

    def submit(request: httpx.Request) -> httpx.Response:
        submitted.append(json.loads(request.content))
        return httpx.Response(201, json={"job_id": "j1", "state": "queued"})

    answers = iter(states)
    api.route("POST", "/v1/jobs", submit)
    api.route("GET", "/v1/jobs/j1",
              lambda r: httpx.Response(200, json={"job_id": "j1", **next(answers)}))
    return submitted


def test_submit_and_wait_returns_the_succeeded_job(api: FakeApi) -> None:
    submitted = _job_api(api, [{"state": "queued"}, {"state": "running", "progress": {"step": 1}},
                               {"state": "succeeded", "result": {"artifact_id": "a1"}}])
    seen: list[object] = []
    job = make(api).submit_and_wait({"type": "generate", "model_id": "m"}, poll=0.0,
                                    on_progress=lambda j: seen.append(j["state"]))
    assert submitted == [{"type": "generate", "model_id": "m"}]
    assert job["result"] == {"artifact_id": "a1"}
    assert seen == ["queued", "running", "succeeded"]


@pytest.mark.parametrize(("final", "message"), [
    ({"state": "failed", "error": {"code": "diverged", "message": "loss is nan"}},
     "job j1 failed: diverged (loss is nan)"),
    ({"state": "cancelled", "error": None}, "job j1 was cancelled"),
])
def test_submit_and_wait_raises_job_failed_carrying_the_job(
        api: FakeApi, final: dict[str, object], message: str) -> None:
    _job_api(api, [{"state": "running"}, final])
    with pytest.raises(JobFailed) as excinfo:
        make(api).submit_and_wait({"type": "finetune"}, poll=0.0)
    err = excinfo.value
    assert str(err) == message
    assert err.job["state"] == final["state"] and err.job_id == "j1"
    assert err.state == final["state"]


def test_submit_and_wait_times_out_and_a_refused_spec_is_the_api_error(api: FakeApi) -> None:
    _job_api(api, [{"state": "running"}] * 100)
    with pytest.raises(TimeoutError, match="job j1 still running"):
        make(api).submit_and_wait({"type": "finetune"}, timeout=0.05, poll=0.01)
    api.route("POST", "/v1/jobs", lambda r: problem(409, "privacy_budget_exhausted", "no"))
    with pytest.raises(ApiError) as excinfo:
        make(api).submit_and_wait({"type": "finetune"}, poll=0.0)
    assert excinfo.value.code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED
