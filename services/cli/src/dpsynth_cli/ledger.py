"""``dpsynth ledger ...``: a private dataset's privacy ledger, checked from outside.

``export`` downloads the dataset's hash-chained, signed entries (JSON or CSV). ``verify``
checks an export INDEPENDENTLY of the servers: it recomputes every entry's hash from its
content and ``prev_hash`` (sha256 over canonical JSON, :func:`dpsynth_shared.dp_events.
chain_hash`), checks every Ed25519 signature over ``signed_message(seq, hash)`` with the chain
key (pin it with ``--key-id`` / ``--public-key`` to the one your operator publishes), then
shows the server-side verify report (chain, signatures, anchor, every epsilon recomputed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from dpsynth_shared.dp_events import chain_hash
from dpsynth_shared.grants import key_id_of, verify_message
from dpsynth_shared.ledger_contract import signed_message

from dpsynth_cli.common import cli_errors, console, err_console, print_json, state_of
from dpsynth_cli.options import CliTyper, JsonFlag, YesFlag, confirm_irreversible

app = CliTyper(help="The privacy ledger: export, verify, recompute; admin, disaster "
               "recovery: anchor-status, reconcile-after-restore.")
DatasetIdArg = Annotated[str, typer.Argument(help="a private dataset's id (ds_...)",
                                             show_default=False)]


def anchor_line(status: dict[str, Any]) -> str:
    """One line of ``ledger anchor-status`` (an ``AnchorStatus`` body): in step, behind or
    diverged, with the database's and the anchor's newest entries."""
    heads = (f"database at entry {status.get('local_seq', '?')}, anchor at entry "
             f"{status.get('anchored_seq', '?')} ({status.get('location', '-')})")
    if status.get("diverged"):
        return f"ledger DIVERGED from its anchor: {heads}"
    if status.get("behind"):
        return f"ledger BEHIND its anchor: {heads}"
    return f"ledger in step with its anchor: {heads}"


def entry_hash(entry: dict[str, Any]) -> str:
    """An entry's hash recomputed from its content (the ledger's rule, reimplemented)."""
    content = {"seq": entry["seq"], "dataset_id": entry["dataset_id"], "kind": entry["kind"],
               "payload": entry["payload"]}
    return chain_hash(str(entry["prev_hash"]), content)


def _key_problems(export: dict[str, Any], public_key: str | None,
                  key_id: str | None) -> tuple[str | None, list[str]]:
    """The public key to verify with, and problems with the export's key."""
    problems: list[str] = []
    key = public_key or export.get("public_key")
    if not key:
        return None, ["export: no chain public key to check signatures with"]
    try:
        actual = key_id_of(key)
    except (ValueError, TypeError):
        return None, ["export: the public key is not valid urlsafe base64"]
    if public_key and export.get("public_key") and export["public_key"] != public_key:
        problems.append("export: its public key is not the one you pinned")
    if export.get("key_id") and export["key_id"] != actual:
        problems.append(f"export: key_id {export['key_id']} is not the public key's ({actual})")
    if key_id and key_id != actual:
        problems.append(f"export: the chain key's id {actual} is not the pinned {key_id}")
    return key, problems


def _retired_keys(export: dict[str, Any], pinned: bool, retired_key_ids: Sequence[str],
                  problems: list[str]) -> dict[str, str]:
    """key id → public key of the export's retired chain keys that may verify entries.

    Unpinned, the export's list is taken as it is. Once the caller pins the current key, a
    retired key counts only when its id is pinned too: otherwise a forger could re-sign
    every entry with a key of their own and list it as "retired".
    """
    out: dict[str, str] = {}
    for public in export.get("retired_public_keys") or []:
        try:
            kid = key_id_of(str(public))
        except (ValueError, TypeError):
            problems.append("export: a retired public key is not valid urlsafe base64")
            continue
        if not pinned or kid in retired_key_ids:
            out[kid] = str(public)
    return out


def verify_export(export: dict[str, Any], *, public_key: str | None = None,
                  key_id: str | None = None,
                  retired_key_ids: Sequence[str] = ()) -> tuple[list[str], int]:
    """Check an export locally; returns (problems naming the entries, signatures checked).

    Per entry: the hash recomputed from its content and ``prev_hash``; the signature over
    ``signed_message(seq, hash)``; its key id; its budget. Across entries: increasing seq,
    adjacent sequence numbers linked by ``prev_hash`` (the chain is global: entries of other
    datasets sit between the others), a ``budget_created`` first, and a recorded filter
    figure (``figures.dataset_epsilon_spent``) that never decreases.
    """
    key, problems = _key_problems(export, public_key, key_id)
    keys = _retired_keys(export, bool(public_key or key_id), retired_key_ids, problems)
    if key is not None:
        keys[key_id_of(key)] = key
    entries: list[dict[str, Any]] = list(export.get("entries") or [])
    budget = export.get("budget_id") or export.get("dataset_id")
    if not entries:
        problems.append("export: no entries")
        return problems, 0
    if entries[0].get("kind") != "budget_created":
        problems.append(f"entry {entries[0].get('seq')}: the first entry is not budget_created")
    checked, signed_seen = 0, False
    previous: dict[str, Any] | None = None
    spent = 0.0
    for e in entries:
        seq = e.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            problems.append(f"entry {seq}: malformed (its seq is not an integer)")
            continue
        try:
            if entry_hash(e) != e.get("hash"):
                problems.append(f"entry {seq}: hash mismatch (content altered)")
        except (KeyError, TypeError, ValueError):
            problems.append(f"entry {seq}: malformed (cannot recompute its hash)")
            continue
        if e.get("dataset_id") != budget:
            problems.append(f"entry {seq}: belongs to {e.get('dataset_id')}, not {budget}")
        signature = e.get("signature")
        if signature:
            signed_seen = True
            if key is not None:
                checked += 1
                # an entry signed before a chain-key rotation names a retired key
                signer = keys.get(str(e.get("key_id")), key)
                if not verify_message(signed_message(int(e["seq"]), str(e["hash"])),
                                      str(signature), signer):
                    problems.append(f"entry {seq}: signature invalid")
                elif e.get("key_id") and e["key_id"] not in keys:
                    problems.append(f"entry {seq}: signed by key {e.get('key_id')}, not the "
                                    f"chain key {export.get('key_id')} nor a retired one")
        elif signed_seen:
            problems.append(f"entry {seq}: not signed (after signed entries)")
        if previous is not None:
            if int(seq) <= int(previous["seq"]):
                problems.append(f"entry {seq}: out of order after entry {previous['seq']}")
            elif int(seq) == int(previous["seq"]) + 1 and e.get("prev_hash") != previous["hash"]:
                problems.append(f"entry {seq}: prev_hash does not link to entry {previous['seq']}")
        figures = e.get("payload", {}).get("figures")
        if isinstance(figures, dict) and figures.get("dataset_epsilon_spent") is not None:
            now = float(figures["dataset_epsilon_spent"])
            if now < spent:
                problems.append(f"entry {seq}: dataset_epsilon_spent {now} is below an "
                                f"earlier {spent} (spent never decreases)")
            spent = max(spent, now)
        previous = e
    return problems, checked


@app.command("export")
@cli_errors
def export(ctx: typer.Context, dataset_id: DatasetIdArg,
           fmt: Annotated[str, typer.Option("--format", help="json | csv")] = "json",
           output: Annotated[Path | None, typer.Option("-o", "--output",
                                                       help="write here (default stdout)")]
           = None) -> None:
    """Export a private dataset's ledger history (signed, hash-chained entries)."""
    if fmt not in {"json", "csv"}:
        raise typer.BadParameter("must be json or csv", param_hint="--format")
    body = state_of(ctx).client().ledger_export(dataset_id, fmt=fmt)
    text = body if isinstance(body, str) else json.dumps(body, indent=2, sort_keys=True)
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    output.write_text(text if text.endswith("\n") else text + "\n")
    count = len(body["entries"]) if isinstance(body, dict) else max(0, text.count("\n") - 1)
    console.print(f"saved {output} ({count} entries)", highlight=False)


@app.command("verify")
@cli_errors
def verify(ctx: typer.Context, dataset_id: DatasetIdArg,
           export_file: Annotated[Path | None, typer.Option(
               "--export", exists=True, dir_okay=False,
               help="check this JSON export instead of downloading one")] = None,
           public_key: Annotated[str | None, typer.Option(
               help="pin the chain public key (else the export's)")] = None,
           key_id: Annotated[str | None, typer.Option(
               help="pin the chain key id your operator publishes")] = None,
           retired_key_id: Annotated[list[str] | None, typer.Option(
               help="with a pinned key: also accept entries signed by this retired chain "
               "key (repeatable; ids your operator published before a key rotation)")]
           = None,
           local_only: Annotated[bool, typer.Option(
               "--local-only", help="skip the server-side report")] = False,
           json_: Annotated[bool, typer.Option(
               "--json", help="print the server's verify report, the api's JSON body (the "
               "summary lines go to stderr)")] = False) -> None:
    """Recompute every entry's hash and signature locally, then show the server's report
    (chain, signatures, anchor, every epsilon); exit 1 on any problem."""
    out = err_console if json_ else console  # stdout holds only the JSON with --json
    client = state_of(ctx).client()
    body = (json.loads(export_file.read_text()) if export_file is not None
            else client.ledger_export(dataset_id))
    problems, checked = verify_export(body, public_key=public_key, key_id=key_id,
                                      retired_key_ids=retired_key_id or [])
    entries = len(body.get("entries") or [])
    out.print(f"local: {entries} entries, hashes recomputed, {checked} signatures checked "
                  f"(key {body.get('key_id') or '-'})", highlight=False)
    for line in problems:
        err_console.print(f"[bold red]problem[/] {line}", highlight=False)
    ok = not problems
    if not local_only:
        report = client.ledger_verify(dataset_id)
        out.print(f"server: {'ok' if report.get('ok') else 'NOT OK'}, "
                      f"{report.get('entries')} entries, "
                      f"{report.get('signatures_checked', 0)} signatures", highlight=False)
        for line in report.get("problems") or []:
            err_console.print(f"[bold red]server problem[/] {line}", highlight=False)
        if json_:
            print_json(report)
        ok = ok and bool(report.get("ok"))
    if not ok:
        raise typer.Exit(1)
    out.print("verified", style="bold green", highlight=False)


@app.command("recompute")
@cli_errors
def recompute(ctx: typer.Context, dataset_id: DatasetIdArg, json_: JsonFlag = False) -> None:
    """Recompute every charge and figure with the ledger's current accountant code next to
    the recorded ones (a report: nothing stored changes, nothing is re-admitted)."""
    report = state_of(ctx).client().ledger_recompute(dataset_id)
    if json_:
        print_json(report)
    differences = report.get("differences") or []
    for line in differences:
        err_console.print(f"[yellow]difference[/] {line}", highlight=False)
    if not json_:
        console.print(f"recomputed with the current accountant: {len(differences)} "
                      "difference(s) from the recorded figures", highlight=False)


@app.command("reconcile-after-restore")
@cli_errors
def reconcile_after_restore(ctx: typer.Context, yes: YesFlag = False,
                            json_: JsonFlag = False) -> None:
    """admin, disaster recovery: only after restoring the ledger's database from a backup.

    Re-charges every job found in the ledger's anchor log or in the api, re-bases the
    anchor, and prints the spent epsilon per dataset before and after. Asks for
    confirmation (--yes skips it). Admin scope. Safe to run again.
    """
    confirm_irreversible("reconcile the ledger after a restore: re-charge every job of the "
                         "anchor log and the api, and re-base the anchor", yes=yes)
    report = state_of(ctx).client().ledger_reconcile()
    out = err_console if json_ else console  # stdout holds only the JSON with --json
    if json_:
        print_json(report)
    before, after = report.get("spent_before") or {}, report.get("spent_after") or {}
    for dataset_id in sorted(after):
        out.print(f"{dataset_id}: spent {before.get(dataset_id, 0.0):.6g} -> "
                      f"{after[dataset_id]:.6g}", highlight=False)
    for line in report.get("notes") or []:
        err_console.print(f"[yellow]note[/] {line}", highlight=False)
    if not report.get("ok"):
        err_console.print("[bold red]reconciliation left problems[/] (see the notes)",
                          highlight=False)
        raise typer.Exit(1)
    out.print(f"reconciled: {report.get('entries_replayed', 0)} anchored entries "
                  f"re-applied, {len(report.get('jobs_recharged') or [])} api jobs re-charged",
                  style="bold green", highlight=False)


@app.command("anchor-status")
@cli_errors
def anchor_status(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """admin, disaster recovery: the ledger's chain head against its append-only anchor.

    Exits 1 when the ledger is behind or diverged (admissions are refused until
    reconcile-after-restore). Admin scope; changes nothing.
    """
    status = state_of(ctx).client().ledger_anchor()
    if json_:
        print_json(status)
    else:
        console.print(anchor_line(status), highlight=False, soft_wrap=True)
    if status.get("behind") or status.get("diverged"):
        err_console.print("[bold red]the ledger is behind its anchor[/]: run `dpsynth ledger "
                          "reconcile-after-restore`", highlight=False)
        raise typer.Exit(1)
