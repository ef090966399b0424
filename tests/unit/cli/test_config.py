"""Config resolution (options > env > credentials file) and the secrets file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from dpsynth_cli.config import DEFAULT_HOME, resolve_config, resolve_home
from dpsynth_cli.embedded.secrets import load_or_create_secrets
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.grants import public_key_of


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    (tmp_path / "credentials.json").write_text(
        json.dumps({"api_url": "http://file:1/", "tenant_id": "t", "api_key": "file-key"}))
    return tmp_path


def test_options_win_over_env_and_file(home: Path) -> None:
    cfg = resolve_config(api_url="http://opt:3", api_key="opt-key", home=home,
                         env={"DPSYNTH_API_URL": "http://env:2", "DPSYNTH_API_KEY": "env-key"})
    assert (cfg.api_url, cfg.api_key) == ("http://opt:3", "opt-key")
    assert (cfg.url_source, cfg.key_source) == ("--api-url", "--api-key")


def test_env_wins_over_file(home: Path) -> None:
    cfg = resolve_config(api_url=None, api_key=None, home=home,
                         env={"DPSYNTH_API_URL": "http://env:2", "DPSYNTH_API_KEY": "env-key"})
    assert (cfg.api_url, cfg.api_key) == ("http://env:2", "env-key")


def test_file_is_the_fallback_and_each_field_resolves_alone(home: Path) -> None:
    cfg = resolve_config(api_url=None, api_key=None, home=home, env={})
    assert (cfg.api_url, cfg.api_key) == ("http://file:1", "file-key")  # trailing / stripped
    mixed = resolve_config(api_url="http://opt:3", api_key=None, home=home,
                           env={"DPSYNTH_API_KEY": "env-key"})
    assert (mixed.api_url, mixed.api_key) == ("http://opt:3", "env-key")
    assert mixed.key_source == "DPSYNTH_API_KEY"


def test_home_comes_from_env_when_not_given(home: Path) -> None:
    cfg = resolve_config(api_url=None, api_key=None, env={"DPSYNTH_HOME": str(home)})
    assert cfg.api_key == "file-key"
    assert cfg.key_source == str(home / "credentials.json")
    assert resolve_home(None, {}) == DEFAULT_HOME
    assert resolve_home("/x", {"DPSYNTH_HOME": "/y"}) == Path("/x")


def test_nothing_configured_is_unauthenticated(tmp_path: Path) -> None:
    with pytest.raises(DpsynthError) as excinfo:
        resolve_config(api_url=None, api_key=None, home=tmp_path, env={})
    assert excinfo.value.code == ErrorCode.UNAUTHENTICATED
    assert "dpsynth up" in excinfo.value.detail


def test_broken_credentials_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").write_text("{not json")
    cfg = resolve_config(api_url="http://a", api_key="k", home=tmp_path, env={})
    assert cfg.api_key == "k"


def test_secrets_file_is_0600_and_generated_once(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = load_or_create_secrets(tmp_path)
    assert second == first
    assert public_key_of(first.grant_signing_key) == first.grant_public_key
    tokens = {first.ledger_token_api, first.ledger_token_worker, first.api_worker_token}
    assert len(tokens) == 3 and all(len(t) >= 32 for t in tokens)


def test_secrets_file_mode_is_tightened(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    (tmp_path / "secrets.json").chmod(0o644)
    assert load_or_create_secrets(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "secrets.json").stat().st_mode) == 0o600


def test_secrets_differ_between_homes(tmp_path: Path) -> None:
    a = load_or_create_secrets(tmp_path / "a")
    b = load_or_create_secrets(tmp_path / "b")
    assert a.grant_signing_key != b.grant_signing_key
    assert a.api_worker_token != b.api_worker_token
