"""``dpsynth jobs ...``: submit (with dry run), list, show, watch, cancel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from dpsynth_client import Client
from dpsynth_shared.errors import DpsynthError, ErrorCode
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dpsynth_cli.common import cli_errors, console, print_json, print_table, state_of
from dpsynth_cli.views import progress_text, spent_after_warning

app = typer.Typer(help="Submit and follow jobs.", no_args_is_help=True)


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec from a ``.yaml``/``.yml`` or ``.json`` file."""
    text = path.read_text()
    try:
        spec = yaml.safe_load(text) if path.suffix in {".yaml", ".yml"} else json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"{path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"{path} must hold a mapping (the job spec)")
    return spec


@app.command("submit")
@cli_errors
def submit(ctx: typer.Context, spec_file: Annotated[Path, typer.Argument(exists=True)],
           dry_run: Annotated[bool, typer.Option("--dry-run")] = False,
           watch_: Annotated[bool, typer.Option("--watch")] = False) -> None:
    """Submit SPEC_FILE (.yaml or .json); --dry-run shows the plan and budget impact."""
    client = state_of(ctx).client()
    spec = load_spec(spec_file)
    result = client.submit_job(spec, dry_run=dry_run)
    print_json(result)
    _warn_spent_after(client, spec, result)
    if watch_ and not dry_run:
        raise typer.Exit(watch_job(client, result["job_id"]))


def _warn_spent_after(client: Client, spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Print a WARNING when the job takes the dataset past its warning fraction."""
    dataset_id = spec.get("dataset_id")
    if not isinstance(dataset_id, str) or not isinstance(result, dict):
        return
    try:
        budget = client.get_budget(dataset_id)
    except DpsynthError:
        return  # a public dataset (no budget) or no access: nothing to warn about
    warning = spent_after_warning(result, budget)
    if warning:
        console.print(warning, style="bold yellow", highlight=False, soft_wrap=True)


@app.command("list")
@cli_errors
def list_(ctx: typer.Context,
          state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None
          ) -> None:
    """All jobs of your tenant, newest first."""
    filters = {"state": state} if state else {}
    rows = state_of(ctx).client().list_jobs(**filters)
    print_table(rows, ["job_id", "type", "state", "created_at"], "jobs")


@app.command("show")
@cli_errors
def show(ctx: typer.Context, job_id: str) -> None:
    """One job as JSON."""
    print_json(state_of(ctx).client().get_job(job_id))


@app.command("cancel")
@cli_errors
def cancel(ctx: typer.Context, job_id: str) -> None:
    """Ask for cancellation (steps already granted stay charged)."""
    print_json(state_of(ctx).client().cancel_job(job_id))


@app.command("watch")
@cli_errors
def watch(ctx: typer.Context, job_id: str,
          poll: Annotated[float, typer.Option(help="seconds between polls")] = 2.0) -> None:
    """A progress bar until the job ends; exits 1 unless it succeeded."""
    raise typer.Exit(watch_job(state_of(ctx).client(), job_id, poll=poll))


def watch_job(client: Client, job_id: str, *, poll: float = 2.0,
              timeout: float = 7 * 24 * 3600) -> int:
    """Follow ``job_id`` with a progress bar; returns the exit code (0 only on success)."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(job_id, total=None, info="")

        def show(job: dict[str, Any]) -> None:
            p = job.get("progress") or {}
            progress.update(task, total=p.get("total") or None, completed=p.get("step", 0),
                            info=progress_text(job))

        job = client.wait_for_job(job_id, timeout=timeout, poll=poll, on_progress=show)
    state = job.get("state")
    if state == "succeeded":
        console.print(f"job {job_id} succeeded", highlight=False)
        if job.get("result"):
            print_json(job["result"])
        return 0
    console.print(f"[red]job {job_id} ended {state}[/]: {job.get('error') or ''}", highlight=False)
    return 1
