"""Config resolution (options > env > credentials file), where the platform's home is found
(--home, DPSYNTH_HOME, the nearest .dpsynth above, the last `dpsynth up`), what a user is
told when nothing is configured, and the secrets file."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from dpsynth_cli.config import (
    DEFAULT_HOME,
    NotConfigured,
    locate_home,
    remember_platform,
    resolve_config,
    resolve_home,
    user_state_dir,
)
from dpsynth_cli.embedded.secrets import load_or_create_secrets
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.grants import public_key_of


def make_home(folder: Path, *, url: str = "http://file:1/", key: str = "file-key",
              pid: int | None = None) -> Path:
    """A platform home as `dpsynth up` leaves it: credentials.json (+ platform.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "credentials.json").write_text(
        json.dumps({"api_url": url, "tenant_id": "t", "api_key": key}))
    if pid is not None:
        (folder / "platform.json").write_text(json.dumps(
            {"home": str(folder), "processes": [{"name": "api", "pid": pid, "create_time": 0,
                                                 "log": ""}]}))
    return folder


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path)


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """An environment whose per-user state folder is the test's own (and empty)."""
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.fixture()
def nowhere(tmp_path: Path) -> Path:
    """A folder with no platform in it or above it."""
    folder = tmp_path / "nowhere"
    folder.mkdir()
    if any((p / ".dpsynth").exists() for p in (folder, *folder.parents)):
        pytest.skip("a .dpsynth above the test's temporary folder")
    return folder


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
    assert cfg.home == home
    mixed = resolve_config(api_url="http://opt:3", api_key=None, home=home,
                           env={"DPSYNTH_API_KEY": "env-key"})
    assert (mixed.api_url, mixed.api_key) == ("http://opt:3", "env-key")
    assert mixed.key_source == "DPSYNTH_API_KEY"


def test_home_comes_from_env_when_not_given(home: Path, nowhere: Path,
                                            env: dict[str, str]) -> None:
    cfg = resolve_config(api_url=None, api_key=None, env={**env, "DPSYNTH_HOME": str(home)},
                         cwd=nowhere)
    assert cfg.api_key == "file-key"
    assert cfg.key_source == str(home / "credentials.json")
    assert resolve_home(None, env, cwd=nowhere) == DEFAULT_HOME
    assert resolve_home("/x", {"DPSYNTH_HOME": "/y"}) == Path("/x")


def test_the_nearest_dpsynth_above_the_current_folder_is_found(tmp_path: Path,
                                                               env: dict[str, str],
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    top = make_home(tmp_path / "project" / ".dpsynth", url="http://top:1", key="top-key")
    deep = tmp_path / "project" / "data" / "raw" / "2026"
    deep.mkdir(parents=True)
    (tmp_path / "project" / "data" / ".dpsynth" / "work").mkdir(parents=True)  # no platform
    monkeypatch.chdir(deep)
    cfg = resolve_config(env=env)
    assert (cfg.api_url, cfg.api_key, cfg.home) == ("http://top:1", "top-key", top)
    found = locate_home(None, env)
    assert found.path == top and found.origin == f"the nearest .dpsynth above {deep}"
    assert resolve_home(None, env) == top  # `dpsynth up/down/status` act on it too
    nearer = make_home(tmp_path / "project" / "data" / "raw" / ".dpsynth", key="near-key")
    assert resolve_config(env=env).api_key == "near-key"
    assert resolve_home(None, env) == nearer
    assert resolve_config(env={**env, "DPSYNTH_HOME": str(top)}).api_key == "top-key"


def test_the_last_started_platform_is_the_per_user_default(tmp_path: Path, nowhere: Path,
                                                           env: dict[str, str]) -> None:
    started = make_home(tmp_path / "clone" / ".dpsynth", url="http://last:9", key="last-key")
    pointer = remember_platform(started, env)
    assert pointer == tmp_path / "state" / "dpsynth" / "last-platform.json"
    assert json.loads(pointer.read_text())["home"] == str(started)
    cfg = resolve_config(env=env, cwd=nowhere)
    assert (cfg.api_url, cfg.api_key, cfg.home) == ("http://last:9", "last-key", started)
    assert locate_home(None, env, cwd=nowhere).origin == f"the last `dpsynth up` ({pointer})"
    assert resolve_home(None, env, cwd=nowhere) == started  # a second `up` resumes it
    # a project's own .dpsynth still wins over the per-user default
    own = make_home(nowhere / ".dpsynth", key="own-key")
    assert resolve_config(env=env, cwd=nowhere / "sub").api_key == "own-key"
    assert resolve_home(None, env, cwd=nowhere) == own


def test_a_pointer_to_a_removed_platform_is_ignored(tmp_path: Path, nowhere: Path,
                                                    env: dict[str, str]) -> None:
    remember_platform(tmp_path / "gone" / ".dpsynth", env)
    assert resolve_home(None, env, cwd=nowhere) == DEFAULT_HOME
    (tmp_path / "state" / "dpsynth" / "last-platform.json").write_text("{not json")
    assert resolve_home(None, env, cwd=nowhere) == DEFAULT_HOME


def test_the_per_user_folder_follows_xdg_then_home() -> None:
    assert user_state_dir({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/dpsynth")
    assert user_state_dir({"HOME": "/h"}) == Path("/h/.local/state/dpsynth")
    assert user_state_dir({"XDG_STATE_HOME": "rel", "HOME": "/h"}) == Path(
        "/h/.local/state/dpsynth")  # the XDG spec ignores relative paths


def test_nothing_configured_is_not_an_http_error_and_says_where_it_looked(
        nowhere: Path, env: dict[str, str]) -> None:
    with pytest.raises(NotConfigured) as excinfo:
        resolve_config(env=env, cwd=nowhere)
    err = excinfo.value
    assert not isinstance(err, DpsynthError) and not hasattr(err, "status")
    assert "401" not in str(err) and "unauthenticated" not in str(err)
    assert str(err).startswith("no api URL: not in --api-url or DPSYNTH_API_URL")
    assert f"no .dpsynth in {nowhere} or its parents" in str(err)
    assert str(tmp_state(env) / "last-platform.json") in str(err)
    assert f"start a platform with `dpsynth up` (it creates {nowhere / '.dpsynth'})" in str(err)
    assert err.searched[:2] == ("--api-url", "DPSYNTH_API_URL")
    with pytest.raises(NotConfigured, match=r"^no API key: not in --api-key or DPSYNTH_API_KEY"):
        resolve_config(env={**env, "DPSYNTH_API_URL": "http://env:2"}, cwd=nowhere)


def test_a_platform_running_elsewhere_is_named_instead_of_a_second_up(
        tmp_path: Path, nowhere: Path, env: dict[str, str]) -> None:
    running = make_home(tmp_path / "clone" / ".dpsynth", pid=os.getpid())
    remember_platform(running, env)
    empty = tmp_path / "other" / ".dpsynth"
    with pytest.raises(NotConfigured) as excinfo:
        resolve_config(env={**env, "DPSYNTH_HOME": str(empty)}, cwd=nowhere)
    message = str(excinfo.value)
    assert f"{empty / 'credentials.json'} (DPSYNTH_HOME) does not exist" in message
    assert (f"a platform is running from {running}: run from there (or a folder below it) "
            f"or pass --home {running}") in message
    assert "dpsynth up" not in message
    (running / "platform.json").write_text(json.dumps({"processes": [{"pid": dead_pid()}]}))
    with pytest.raises(NotConfigured, match=re.escape(f"a platform was started from {running}:")):
        resolve_config(home=empty, env=env, cwd=nowhere)


def test_a_home_whose_first_start_did_not_finish_says_so(tmp_path: Path, nowhere: Path,
                                                         env: dict[str, str]) -> None:
    half = tmp_path / "proj" / ".dpsynth"
    half.mkdir(parents=True)
    (half / "secrets.json").write_text("{}")  # `dpsynth up` writes it first
    with pytest.raises(NotConfigured) as excinfo:
        resolve_config(env=env, cwd=tmp_path / "proj" / "sub")
    assert f"the platform in {half} has not finished starting: run `dpsynth up --home " \
        f"{half}`" in str(excinfo.value)


def test_broken_credentials_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").write_text("{not json")
    cfg = resolve_config(api_url="http://a", api_key="k", home=tmp_path, env={})
    assert cfg.api_key == "k"


def tmp_state(env: dict[str, str]) -> Path:
    return Path(env["XDG_STATE_HOME"]) / "dpsynth"


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


# -- through the CLI (issue 15, item 6) -----------------------------------------------------
def test_cli_in_a_sub_folder_acts_on_the_projects_platform(
        tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_cli.main import app
    from typer.testing import CliRunner

    top = make_home(tmp_path / "project" / ".dpsynth", pid=dead_pid())
    deep = tmp_path / "project" / "data" / "raw"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.delenv("DPSYNTH_HOME", raising=False)
    result = CliRunner().invoke(app, ["status", "--json"], env=env)
    assert result.exit_code == 3, result.output  # not running, and it is that platform
    assert json.loads(result.output)["home"] == str(top)
    assert not (deep / ".dpsynth").exists()


def test_cli_names_the_running_platform_instead_of_suggesting_a_second(
        tmp_path: Path, nowhere: Path, env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_cli.main import app
    from typer.testing import CliRunner

    running = make_home(tmp_path / "clone" / ".dpsynth", pid=os.getpid())
    remember_platform(running, env)
    monkeypatch.chdir(nowhere)
    for name in ("DPSYNTH_API_URL", "DPSYNTH_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["datasets", "list"],
                                env={**env, "DPSYNTH_HOME": str(nowhere / ".dpsynth")})
    assert result.exit_code == 2
    assert f"a platform is running from {running}: run from there" in result.output
    assert "[401]" not in result.output and "unauthenticated" not in result.output
    assert "dpsynth up" not in result.output
