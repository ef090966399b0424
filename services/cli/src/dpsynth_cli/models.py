"""``dpsynth models ...`` and ``dpsynth download`` (artifacts: corpora, reports)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

from dpsynth_cli.common import (
    cli_errors,
    console,
    err_console,
    print_json,
    print_rows,
    print_table,
    state_of,
)
from dpsynth_cli.options import CliTyper, JsonFlag, output_mode
from dpsynth_cli.resources import print_created
from dpsynth_cli.summaries import audit_summary_line, model_line
from dpsynth_cli.views import model_privacy_lines

app = CliTyper(help="Upload, inspect and download models.")
ModelIdArg = Annotated[str, typer.Argument(help="a model id (mdl_...)", show_default=False)]


@app.command("list")
@cli_errors
def list_models(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """Your models."""
    rows = state_of(ctx).client().list_models()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["model_id", "name", "source", "created_at"], "models")


@app.command("upload")
@cli_errors
def upload_model(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(
        exists=True, show_default=False,
        help="a diffusers save_pretrained folder, or its .tar / .zip")],
    name: Annotated[str, typer.Option(help="a display name")],
    json_: JsonFlag = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the new model's id (for X=$(dpsynth ...))")]
    = False,
) -> None:
    """Upload a diffusers save_pretrained folder (safetensors only) or its .tar / .zip."""
    mode = output_mode(json_, quiet)
    print_created(state_of(ctx).client().upload_model(path, name=name), mode, "model_id",
                  model_line)


@app.command("show")
@cli_errors
def show_model(ctx: typer.Context, model_id: ModelIdArg, json_: JsonFlag = False) -> None:
    """One model: where it comes from and, for a DP model, its privacy figures, each
    labelled, and the latest audit of the finetune that produced it, or "not audited"
    (with --json: the api's body on stdout, the labelled figures on stderr)."""
    body = state_of(ctx).client().get_model(model_id)
    if json_:
        print_json(body)
        for label, value in model_privacy_lines(body):
            err_console.print(f"{label}: {value}", highlight=False, markup=False,
                              soft_wrap=True)
        return
    console.print(model_line(body), highlight=False, soft_wrap=True)
    made_by = body.get("produced_by_job_id")
    audit = audit_summary_line(body.get("audit"), this=f"its finetune {made_by}",
                               job_id=made_by)
    rows = [("dataset", str(body.get("dataset_id") or "-")),
            ("jobs", ", ".join(body.get("job_ids") or []) or "-"),
            *model_privacy_lines(body),
            *([("privacy audit", audit)] if audit else []),
            ("publishable", "yes" if body.get("publishable") else "no"),
            ("sha256", str(body.get("sha256") or "-")),
            ("created", str(body.get("created_at") or "-"))]
    print_rows(rows)


@app.command("download")
@cli_errors
def download_model(ctx: typer.Context, model_id: ModelIdArg,
                   output: Annotated[Path | None, typer.Option(
                       "-o", "--output", help="the zip to write (default: MODEL_ID.zip)")]
                   = None) -> None:
    """Download a model as a zip of its folder (a diffusion model: its diffusers folder,
    re-uploadable as is; a dp_train classifier: its safetensors weights and info)."""
    client = state_of(ctx).client()
    path = with_progress(model_id, lambda on_chunk: client.download_model(
        model_id, output or Path(f"{model_id}.zip"), on_chunk=on_chunk))
    console.print(f"saved {path} ({path.stat().st_size} bytes)", highlight=False)


def with_progress(label: str,
                  fetch: Callable[[Callable[[int, int | None], None]], Path]) -> Path:
    """Run a streamed download under a progress bar on stderr (total unknown until a
    length comes)."""
    with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
                  console=err_console) as progress:
        task = progress.add_task(label, total=None)

        def on_chunk(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        return fetch(on_chunk)


@cli_errors
def download(ctx: typer.Context,
             artifact_id: Annotated[str, typer.Argument(
                 help="an artifact id (art_...): a generate job's corpus, a report",
                 show_default=False)],
             output: Annotated[Path | None, typer.Option(
                 "-o", "--output", help="the file to write (default: the artifact's file "
                 "name)")] = None) -> None:
    """Download an artifact (streamed, with a progress bar on stderr)."""
    client = state_of(ctx).client()
    if output is None:
        meta = client.get_artifact(artifact_id)
        name = meta.get("filename") or Path(str(meta.get("key") or artifact_id)).name
        output = Path(name)
    target = output
    path = with_progress(artifact_id, lambda on_chunk: client.download_artifact(
        artifact_id, target, on_chunk=on_chunk))
    console.print(f"saved {path} ({path.stat().st_size} bytes)", highlight=False)
