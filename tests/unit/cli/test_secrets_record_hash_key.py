"""The embedded secrets file gains the api's record hash key once, keeping every other
secret, and the api's env carries it (a new key would stop later uploads from matching the
subjects already stored)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from dpsynth_cli.embedded.platform import PlatformState, service_env
from dpsynth_cli.embedded.secrets import load_or_create_secrets


def test_new_secrets_have_a_strong_record_hash_key(tmp_path: Path) -> None:
    s = load_or_create_secrets(tmp_path)
    assert len(s.record_hash_key) >= 32
    others = {s.ledger_token_api, s.ledger_token_worker, s.api_worker_token}
    assert s.record_hash_key not in others
    assert load_or_create_secrets(tmp_path / "b").record_hash_key != s.record_hash_key


def test_an_older_secrets_file_gets_a_record_hash_key_once(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    old = json.loads(path.read_text())
    del old["record_hash_key"]  # as written before the key existed
    path.write_text(json.dumps(old))
    upgraded = load_or_create_secrets(tmp_path)
    assert upgraded.record_hash_key and upgraded.record_hash_key != first.record_hash_key
    kept = {k: v for k, v in json.loads(path.read_text()).items() if k != "record_hash_key"}
    assert kept == old  # every other secret is kept
    assert load_or_create_secrets(tmp_path) == upgraded  # added once, then stable
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".secrets.json.*"))


def test_a_file_older_than_both_keys_gets_both(tmp_path: Path) -> None:
    load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    old = json.loads(path.read_text())
    del old["record_hash_key"], old["chain_signing_key"]
    path.write_text(json.dumps(old))
    upgraded = load_or_create_secrets(tmp_path)
    assert upgraded.record_hash_key and upgraded.chain_signing_key
    assert {k: v for k, v in json.loads(path.read_text()).items()
            if k not in ("record_hash_key", "chain_signing_key")} == old


def test_the_api_env_carries_the_record_hash_key(tmp_path: Path) -> None:
    s = load_or_create_secrets(tmp_path)
    state = PlatformState(home=str(tmp_path), pgdata=str(tmp_path / "pg"),
                          database_url="postgresql+psycopg://x", redis_url="redis://x",
                          ledger_url="http://l", api_url="http://a")
    env = service_env(home=tmp_path, state=state, secrets=s, ledger_port=1, api_port=2)
    assert env["api"]["DPSYNTH_API_RECORD_HASH_KEY"] == s.record_hash_key
    assert all(s.record_hash_key not in v.values() for k, v in env.items() if k != "api")
