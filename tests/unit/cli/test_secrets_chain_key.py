"""The embedded secrets file gains the ledger's chain key once, keeping every other secret."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from dpsynth_cli.embedded.platform import service_env
from dpsynth_cli.embedded.secrets import load_or_create_secrets
from dpsynth_shared.grants import public_key_of


def test_new_secrets_have_a_chain_key_distinct_from_the_grant_key(tmp_path: Path) -> None:
    s = load_or_create_secrets(tmp_path)
    assert public_key_of(s.chain_signing_key)  # a valid Ed25519 key
    assert s.chain_signing_key != s.grant_signing_key


def test_an_older_secrets_file_gets_a_chain_key_once(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    old = json.loads(path.read_text())
    del old["chain_signing_key"]  # as written before the chain key existed
    path.write_text(json.dumps(old))
    upgraded = load_or_create_secrets(tmp_path)
    assert upgraded.chain_signing_key and upgraded.chain_signing_key != first.chain_signing_key
    kept = {k: v for k, v in json.loads(path.read_text()).items() if k != "chain_signing_key"}
    assert kept == old  # every other secret is kept
    assert load_or_create_secrets(tmp_path) == upgraded  # added once, then stable
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".secrets.json.*"))  # no temporary file left behind


def test_the_ledger_env_carries_the_chain_key_and_anchor(tmp_path: Path) -> None:
    from dpsynth_cli.embedded.platform import PlatformState

    s = load_or_create_secrets(tmp_path)
    state = PlatformState(home=str(tmp_path), pgdata=str(tmp_path / "pg"),
                          database_url="postgresql+psycopg://x", redis_url="redis://x",
                          ledger_url="http://l", api_url="http://a")
    env = service_env(home=tmp_path, state=state, secrets=s, ledger_port=1, api_port=2)
    ledger = env["ledger"]
    assert ledger["DPSYNTH_LEDGER_CHAIN_SIGNING_KEY"] == s.chain_signing_key
    anchor = Path(ledger["DPSYNTH_LEDGER_ANCHOR__PATH"])
    assert anchor.parent == tmp_path and not anchor.is_relative_to(tmp_path / "pg")
