"""``--help`` of every command is complete and fits 80 columns, and the irreversible admin
commands ask before they act (issue 15, items 1 and 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from dpsynth_cli.main import app
from rich.cells import cell_len
from typer.main import get_command
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, use_fake_api

runner = CliRunner()


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``command``, with the words that call it."""
    yield path, command
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(get_command(app)))


def test_every_option_and_argument_has_a_help_text() -> None:
    missing = [f"dpsynth {' '.join(path)} {param.name}" for path, command in COMMANDS
               for param in command.params if not (getattr(param, "help", None) or "").strip()]
    assert missing == []


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=" ".join)
def test_help_at_80_columns_has_no_bool_noise_nor_cut_words(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "<bool>" not in text
    assert "…" not in text  # rich cuts a word it cannot fit
    assert max(cell_len(line) for line in text.splitlines()) <= 80


def test_the_disaster_recovery_commands_say_so_first() -> None:
    for name in ("reconcile-after-restore", "anchor-status"):
        help_text = get_command(app).commands["ledger"].commands[name].help  # type: ignore[attr-defined]
        assert help_text.startswith("admin, disaster recovery:"), name


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = use_fake_api(monkeypatch)
    fake.route("POST", "/v1/admin/ledger/reconcile", lambda r: httpx.Response(200, json={
        "ok": True, "spent_before": {"ds_1": 1.0}, "spent_after": {"ds_1": 2.5},
        "entries_replayed": 3, "jobs_recharged": ["job_1"], "notes": []}))
    return fake


def test_reconcile_without_a_terminal_or_yes_is_refused(api: FakeApi) -> None:
    result = runner.invoke(app, ["ledger", "reconcile-after-restore"])
    assert result.exit_code == 2
    assert "refused" in result.stderr and "--yes" in result.stderr
    assert api.requests == []
    result = runner.invoke(app, ["ledger", "reconcile-after-restore", "--yes"])
    assert result.exit_code == 0, result.output
    assert "ds_1: spent 1 -> 2.5" in result.stdout and "reconciled: 3" in result.stdout
    assert len(api.requests) == 1


@pytest.mark.parametrize(("answer", "code", "sent"), [("y\n", 0, 1), ("n\n", 1, 0)])
def test_reconcile_on_a_terminal_asks_first(api: FakeApi, monkeypatch: pytest.MonkeyPatch,
                                            answer: str, code: int, sent: int) -> None:
    monkeypatch.setattr("dpsynth_cli.options.stdin_is_terminal", lambda: True)
    result = runner.invoke(app, ["ledger", "reconcile-after-restore"], input=answer)
    assert result.exit_code == code, result.output
    assert "cannot be undone" in result.output
    assert len(api.requests) == sent


def test_a_key_revocation_asks_too(api: FakeApi) -> None:
    api.route("POST", "/v1/keys/key_1/revoke", {"key_id": "key_1", "revoked_at": "now"})
    assert runner.invoke(app, ["admin", "key", "revoke", "key_1"]).exit_code == 2
    assert api.requests == []
    result = runner.invoke(app, ["admin", "key", "revoke", "key_1", "--yes"])
    assert result.exit_code == 0 and result.stdout == "key key_1 revoked at now\n"


def test_a_dataset_deletion_asks_too(api: FakeApi) -> None:
    api.route("DELETE", "/v1/datasets/ds_1", {"dataset_id": "ds_1", "deleted_at": "now"})
    refused = runner.invoke(app, ["datasets", "delete", "ds_1"])
    assert refused.exit_code == 2 and "--yes" in refused.stderr and api.requests == []
    result = runner.invoke(app, ["datasets", "delete", "ds_1", "--yes"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and result.stdout.startswith("deleted the data of dataset ds_1")


def test_anchor_status_says_behind_in_one_line_and_exits_1(api: FakeApi) -> None:
    status = {"location": "/state/anchor.log", "local_seq": 10, "local_hash": "a",
              "anchored_seq": 42, "anchored_hash": "b", "behind": True, "diverged": False,
              "public_key": "k", "key_id": "kid"}
    api.route("GET", "/v1/admin/ledger/anchor", status)
    result = runner.invoke(app, ["ledger", "anchor-status"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert result.stdout == ("ledger BEHIND its anchor: database at entry 10, anchor at entry "
                             "42 (/state/anchor.log)\n")
    assert "reconcile-after-restore" in result.stderr
    as_json = runner.invoke(app, ["ledger", "anchor-status", "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout) == status
