"""``dpsynth ledger export|verify|recompute``, ``datasets set-limit``, the budget WARNING line,
the submit warning and ``admin tenant set-policy``, against the in-process fake api.

The export here is built and signed like the ledger builds its entries (chain_hash over the
canonical content, Ed25519 over signed_message(seq, hash)), so the CLI's independent checks run
on real signatures; tampering with one entry must name that entry and exit 1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
from dpsynth_cli.ledger import verify_export
from dpsynth_cli.main import app
from dpsynth_cli.views import budget_lines, spent_after_warning
from dpsynth_shared.dp_events import GENESIS_HASH, chain_hash
from dpsynth_shared.grants import generate_signing_key, key_id_of, public_key_of, sign_message
from dpsynth_shared.ledger_contract import signed_message
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi

runner = CliRunner()
DATASET = "ds_1"
KEY = generate_signing_key()
PUBLIC = public_key_of(KEY)


def signed_export(key: str = KEY) -> dict[str, Any]:
    """A global chain of 6 entries, 4 of them the dataset's (others' entries between)."""
    public = public_key_of(key)
    prev, entries = GENESIS_HASH, []
    spent = 0.0
    kinds = [(DATASET, "budget_created"), ("ds_other", "budget_created"),
             (DATASET, "reservation_accepted"), (DATASET, "lease_granted"),
             ("ds_other", "lease_granted"), (DATASET, "limit_lowered")]
    for seq, (dataset, kind) in enumerate(kinds, start=1):
        if kind == "lease_granted":
            spent += 1.25
        payload = {"v": 1, "kind": kind, "dataset_id": dataset,
                   "figures": {"dataset_epsilon_spent": spent}}
        digest = chain_hash(prev, {"seq": seq, "dataset_id": dataset, "kind": kind,
                                   "payload": payload})
        entry = {"seq": seq, "at": "2026-11-21T10:00:00+00:00", "dataset_id": dataset,
                 "kind": kind, "payload": payload, "prev_hash": prev, "hash": digest,
                 "signature": sign_message(signed_message(seq, digest), key),
                 "key_id": key_id_of(public)}
        prev = digest
        if dataset == DATASET:
            entries.append(entry)
    return {"dataset_id": DATASET, "budget_id": DATASET, "exported_at": "2026-11-21T10:00:00Z",
            "public_key": public, "key_id": key_id_of(public), "entries": entries}


SERVER_OK = {"ok": True, "entries": 4, "head": "h" * 64, "problems": [], "details": {},
             "signatures_checked": 6}


def test_an_untouched_export_verifies_locally() -> None:
    problems, checked = verify_export(signed_export())
    assert problems == [] and checked == 4


def test_an_edited_entry_is_named() -> None:
    export = signed_export()
    export["entries"][2]["payload"]["figures"]["dataset_epsilon_spent"] = 0.1  # seq 4
    problems, _ = verify_export(export)
    assert problems == ["entry 4: hash mismatch (content altered)"]


def test_a_rehashed_forgery_fails_its_signature() -> None:
    export = signed_export()
    e = export["entries"][2]
    e["payload"]["figures"]["dataset_epsilon_spent"] = 1.25  # rehash the edit
    e["kind"] = "read_grant"
    e["hash"] = chain_hash(e["prev_hash"], {k: e[k] for k in ("seq", "dataset_id", "kind",
                                                              "payload")})
    problems, _ = verify_export(export)
    assert "entry 4: signature invalid" in problems


def test_a_re_signed_export_fails_a_pinned_key() -> None:
    other = generate_signing_key()
    export = signed_export(other)  # a whole export signed by someone else's key
    assert verify_export(export)[0] == []  # consistent in itself...
    problems, _ = verify_export(export, key_id=key_id_of(PUBLIC))  # ...not the operator's key
    assert any("pinned" in p for p in problems)
    problems, _ = verify_export(export, public_key=PUBLIC)
    assert any(p.startswith("entry ") and "signature invalid" in p for p in problems)


def test_a_removed_entry_or_broken_link_is_named() -> None:
    export = signed_export()
    export["entries"][1]["prev_hash"] = "0" * 64  # seq 3 (seq 2 is another dataset's)
    problems, _ = verify_export(export)
    assert any(p.startswith("entry 3:") for p in problems)
    export = signed_export()
    export["entries"][2]["prev_hash"] = "f" * 64  # seq 4 follows seq 3 directly
    problems, _ = verify_export(export)
    assert any(p.startswith("entry 4:") for p in problems)


def test_cli_verify_exits_1_and_names_the_tampered_entry(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", f"/v1/datasets/{DATASET}/ledger/verify", SERVER_OK)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(signed_export()))
    result = runner.invoke(app, ["ledger", "verify", DATASET, "--export", str(good)])
    assert result.exit_code == 0, result.output
    assert "4 signatures checked" in result.output and "verified" in result.output
    tampered = copy.deepcopy(signed_export())
    tampered["entries"][3]["payload"]["epsilon_limit"] = 99.0  # seq 6
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(tampered))
    result = runner.invoke(app, ["ledger", "verify", DATASET, "--export", str(bad)])
    assert result.exit_code == 1
    assert "entry 6: hash mismatch" in result.output
    assert "server: ok" in result.output  # the server's report is shown as well


def test_cli_verify_downloads_and_fails_on_a_server_problem(api: FakeApi) -> None:
    api.route("GET", f"/v1/datasets/{DATASET}/ledger", signed_export())
    api.route("GET", f"/v1/datasets/{DATASET}/ledger/verify", {
        **SERVER_OK, "ok": False, "problems": ["entry 4: charge 0.1 != recomputed 0.2"]})
    result = runner.invoke(app, ["ledger", "verify", DATASET])
    assert result.exit_code == 1
    assert "server: NOT OK" in result.output and "entry 4: charge" in result.output


def test_cli_export_json_and_csv(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", f"/v1/datasets/{DATASET}/ledger", lambda r: httpx.Response(
        200, text="seq,kind\n1,budget_created\n", headers={"content-type": "text/csv"})
        if r.url.params.get("format") == "csv" else httpx.Response(200, json=signed_export()))
    out = tmp_path / "ledger.json"
    result = runner.invoke(app, ["ledger", "export", DATASET, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == signed_export()  # Ed25519 signs deterministically
    result = runner.invoke(app, ["ledger", "export", DATASET, "--format", "csv"])
    assert result.exit_code == 0 and result.output.startswith("seq,kind\n1,budget_created")


def test_cli_recompute_prints_the_report(api: FakeApi) -> None:
    api.route("GET", f"/v1/datasets/{DATASET}/ledger/recompute",
              {"dataset_id": DATASET, "differences": ["entry 4 (lease_granted): ..."]})
    result = runner.invoke(app, ["ledger", "recompute", DATASET])
    assert result.exit_code == 0 and "entry 4 (lease_granted)" in result.output


BUDGET = {"dataset_id": DATASET, "epsilon_limit": 10.0, "dataset_epsilon_spent": 8.5,
          "dataset_epsilon_remaining": 1.5, "warning_fraction": 0.8, "warning": True}


def test_budget_shows_a_clear_warning_line(api: FakeApi) -> None:
    assert ("warning", "WARNING: spent (RDP filter) 8.5000 is at or above 80% of the "
            "epsilon limit 10.0000") in budget_lines(BUDGET)
    api.route("GET", f"/v1/datasets/{DATASET}/budget", BUDGET)
    result = runner.invoke(app, ["budget", DATASET])
    assert result.exit_code == 0 and "WARNING:" in result.output


def test_set_limit_sends_the_patch(api: FakeApi) -> None:
    api.route("PATCH", f"/v1/datasets/{DATASET}/budget", lambda r: httpx.Response(
        200, json={**BUDGET, "sent": json.loads(r.content)}))
    result = runner.invoke(app, ["datasets", "set-limit", DATASET, "--epsilon-limit", "9"])
    assert result.exit_code == 0, result.output
    assert json.loads(api.requests[-1].content) == {"epsilon_limit": 9.0}
    assert "WARNING:" in result.output
    result = runner.invoke(app, ["datasets", "set-limit", DATASET])
    assert result.exit_code == 2


def test_submit_warns_when_the_dry_run_crosses_the_fraction(api: FakeApi,
                                                            tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"type": "finetune", "dataset_id": DATASET}))
    api.route("GET", f"/v1/datasets/{DATASET}/budget", {**BUDGET, "dataset_epsilon_spent": 2.0,
                                                        "warning": False})
    for after, warned in ((7.9, False), (8.1, True)):
        api.route("POST", "/v1/jobs", {"dry_run": True, "plan": {
            "dataset_epsilon_spent_after": after}})
        result = runner.invoke(app, ["jobs", "submit", str(spec), "--dry-run"])
        assert result.exit_code == 0, result.output
        assert ("WARNING: after this job" in result.output) is warned
    assert spent_after_warning({"privacy": {"dataset_epsilon_spent_after": 9.0}},
                               {"epsilon_limit": 10.0, "warning_fraction": 0.95}) is None


def test_admin_set_policy(api: FakeApi) -> None:
    api.route("PUT", "/v1/admin/tenants/ten_1/policy", lambda r: httpx.Response(
        200, json={"sent": json.loads(r.content), "datasets_above_cap": []}))
    result = runner.invoke(app, ["admin", "tenant", "set-policy", "ten_1",
                                 "--max-dataset-epsilon-limit", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads(api.requests[-1].content) == {"max_dataset_epsilon_limit": 4.0}
    result = runner.invoke(app, ["admin", "tenant", "set-policy", "ten_1", "--clear"])
    assert json.loads(api.requests[-1].content) == {"max_dataset_epsilon_limit": None}


def test_an_entry_without_an_integer_seq_is_named_not_a_crash() -> None:
    export = signed_export()
    export["entries"][2]["seq"] = "4"  # a string, as a hand-edited export might carry
    problems, _ = verify_export(export)
    assert "entry 4: malformed (its seq is not an integer)" in problems
