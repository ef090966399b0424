"""Issue 14 item 17: the embedded platform's Redis password lives in ``secrets.json``."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from dpsynth_cli.embedded import load_or_create_secrets
from dpsynth_cli.embedded.platform import PlatformState, service_env


def test_a_new_secrets_file_has_a_random_redis_password(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    other = load_or_create_secrets(tmp_path / "other")
    assert len(first.redis_password) >= 40 and first.redis_password != other.redis_password
    assert json.loads((tmp_path / "secrets.json").read_text())["redis_password"] == \
        first.redis_password


def test_an_older_secrets_file_gets_a_redis_password_once(tmp_path: Path) -> None:
    load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    old = json.loads(path.read_text())
    del old["redis_password"]
    path.write_text(json.dumps(old))
    upgraded = load_or_create_secrets(tmp_path)
    assert upgraded.redis_password
    assert {k: v for k, v in json.loads(path.read_text()).items()
            if k != "redis_password"} == old
    assert load_or_create_secrets(tmp_path) == upgraded
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_api_and_worker_broker_urls_are_the_platforms_redis_url(tmp_path: Path) -> None:
    s = load_or_create_secrets(tmp_path)
    url = f"redis://:{s.redis_password}@127.0.0.1:6390/0"
    state = PlatformState(home=str(tmp_path), pgdata=str(tmp_path / "pg"),
                          database_url="postgresql+psycopg://x", redis_url=url,
                          ledger_url="http://l", api_url="http://a")
    env = service_env(home=tmp_path, state=state, secrets=s, ledger_port=1, api_port=2)
    assert env["api"]["DPSYNTH_API_BROKER_URL"] == url
    assert env["worker"]["DPSYNTH_WORKER_BROKER_URL"] == url
    assert s.redis_password not in env["ledger"].values()
