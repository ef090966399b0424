"""Issue 14 item 11: the embedded platform keeps a metrics token in ``secrets.json`` and gives
it to the api and the ledger (their ``/metrics`` then ask for it); the worker never gets it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from dpsynth_cli.embedded import load_or_create_secrets
from dpsynth_cli.embedded.platform import PlatformState, service_env


def test_a_new_secrets_file_has_a_random_metrics_token(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    other = load_or_create_secrets(tmp_path / "other")
    assert len(first.metrics_token) >= 40 and first.metrics_token != other.metrics_token
    assert json.loads((tmp_path / "secrets.json").read_text())["metrics_token"] == \
        first.metrics_token
    others = {v for k, v in json.loads((tmp_path / "secrets.json").read_text()).items()
              if k != "metrics_token"}
    assert first.metrics_token not in others  # no API key or service token doubles as it


def test_an_older_secrets_file_gets_a_metrics_token_once(tmp_path: Path) -> None:
    load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    old = json.loads(path.read_text())
    del old["metrics_token"]
    path.write_text(json.dumps(old))
    upgraded = load_or_create_secrets(tmp_path)
    assert upgraded.metrics_token
    assert {k: v for k, v in json.loads(path.read_text()).items()
            if k != "metrics_token"} == old
    assert load_or_create_secrets(tmp_path) == upgraded
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_api_and_the_ledger_get_the_metrics_token(tmp_path: Path) -> None:
    s = load_or_create_secrets(tmp_path)
    state = PlatformState(home=str(tmp_path), pgdata=str(tmp_path / "pg"),
                          database_url="postgresql+psycopg://x", redis_url="redis://r",
                          ledger_url="http://l", api_url="http://a")
    env = service_env(home=tmp_path, state=state, secrets=s, ledger_port=1, api_port=2)
    assert env["api"]["DPSYNTH_API_METRICS_TOKEN"] == s.metrics_token
    assert env["ledger"]["DPSYNTH_LEDGER_METRICS_TOKEN"] == s.metrics_token
    assert s.metrics_token not in env["worker"].values()
