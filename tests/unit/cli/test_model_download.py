"""``Client.download_model`` and ``dpsynth models download`` against the in-process fake api."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from dpsynth_cli.main import app
from dpsynth_client import Client
from dpsynth_shared.errors import DpsynthError, ErrorCode
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem, use_fake_api

runner = CliRunner()
PAYLOAD = b"PK\x03\x04" + bytes(range(256)) * 8000


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = use_fake_api(monkeypatch)
    fake.route("GET", "/v1/models/mdl_1/download",
               lambda r: httpx.Response(200, content=PAYLOAD,
                                        headers={"content-type": "application/zip"}))
    fake.route("GET", "/v1/models/mdl_t/download", lambda r: problem(
        409, "not_publishable", "trained with an injected test generator", rng="test"))
    return fake


def client(api: FakeApi) -> Client:
    return Client("http://api.test", api.key, transport=api.transport())


def test_client_streams_the_model_zip(api: FakeApi, tmp_path: Path) -> None:
    progress: list[tuple[int, int | None]] = []
    dest = client(api).download_model("mdl_1", tmp_path / "m" / "model.zip",
                                      on_chunk=lambda d, t: progress.append((d, t)))
    assert dest.read_bytes() == PAYLOAD
    assert progress[-1][0] == len(PAYLOAD)
    assert api.requests[-1].url.path == "/v1/models/mdl_1/download"


def test_client_refusal_leaves_no_file(api: FakeApi, tmp_path: Path) -> None:
    with pytest.raises(DpsynthError) as excinfo:
        client(api).download_model("mdl_t", tmp_path / "t.zip")
    assert excinfo.value.code == ErrorCode.NOT_PUBLISHABLE
    assert list(tmp_path.iterdir()) == []


def test_cli_models_download(api: FakeApi, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "base.zip"
    result = runner.invoke(app, ["models", "download", "mdl_1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == PAYLOAD and "saved" in result.output
    monkeypatch.chdir(tmp_path)  # without -o: MODEL_ID.zip in the working directory
    result = runner.invoke(app, ["models", "download", "mdl_1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mdl_1.zip").read_bytes() == PAYLOAD


def test_cli_models_download_refused(api: FakeApi, tmp_path: Path) -> None:
    result = runner.invoke(app, ["models", "download", "mdl_t", "-o", str(tmp_path / "t.zip")])
    assert result.exit_code == 2
    assert "not_publishable" in result.output
    assert not (tmp_path / "t.zip").exists()
