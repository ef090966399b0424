"""``dpsynth jobs ...``: submit (with dry run and ``--set``), list, show, watch, cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from dpsynth_client import Client
from dpsynth_shared.errors import DpsynthError

from dpsynth_cli.common import (
    cli_errors,
    console,
    err_console,
    print_json,
    print_rows,
    print_table,
    state_of,
)
from dpsynth_cli.follow import watch_job
from dpsynth_cli.options import (
    CliTyper,
    JsonFlag,
    Output,
    PollOption,
    output_mode,
    print_id,
)
from dpsynth_cli.specs import apply_overrides, load_spec
from dpsynth_cli.summaries import (
    EPSILONS_DOC,
    dry_run_line,
    dry_run_rows,
    job_name,
    job_rows,
    submitted_line,
)
from dpsynth_cli.views import spent_after_warning

__all__ = ["app", "load_spec", "watch_job"]

app = CliTyper(help="Submit and follow jobs.")
JobIdArg = Annotated[str, typer.Argument(help="a job id (job_...)", show_default=False)]


@app.command("submit")
@cli_errors
def submit(
    ctx: typer.Context,
    spec_file: Annotated[Path, typer.Argument(
        exists=True, dir_okay=False, show_default=False,
        help="the job spec, a .yaml or .json file (recipes in examples/)")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", show_default=False,
        help="set a spec field, e.g. dataset_id=ds_... or privacy.target_epsilon=2 (dotted "
        "keys reach nested fields; VALUE read as YAML: numbers stay numbers); repeatable")]
    = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="show the plan and what it would spend of the budget; nothing is "
        "stored, reserved or spent")] = False,
    watch_: Annotated[bool, typer.Option(
        "--watch", help="follow the job with a progress bar (on stderr) until it ends; exit "
        "1 unless it succeeded")] = False,
    poll: PollOption = 2.0,
    json_: Annotated[bool, typer.Option(
        "--json", help="print the api's JSON body (with --watch: the finished job's)")]
    = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the job id (with --watch: the id of what the job "
        "produced: model, corpus artifact, or the evaluate job)")] = False,
) -> None:
    """Submit a job spec; --dry-run shows the plan and what it would spend first."""
    mode = output_mode(json_, quiet)
    spec = apply_overrides(load_spec(spec_file), set_ or [])
    client = state_of(ctx).client()
    result = client.submit_job(spec, dry_run=dry_run)
    if dry_run:
        _print_dry_run(client, spec, result, mode)
        return
    job_id = str(result["job_id"])
    if mode is Output.JSON and not watch_:
        print_json(result)
    elif mode is Output.QUIET and not watch_:
        print_id(job_id)
    elif mode is Output.HUMAN:
        console.print(submitted_line(result), highlight=False, soft_wrap=True)
    _warn_spent_after(client, spec, result)
    if watch_:
        raise typer.Exit(watch_job(client, job_id, poll=poll, mode=mode))


def _dataset_budget(client: Client, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The budget view of the spec's dataset; None for a public dataset or without access."""
    dataset_id = spec.get("dataset_id")
    if not isinstance(dataset_id, str):
        return None
    try:
        return client.get_budget(dataset_id)
    except DpsynthError:
        return None  # a public dataset (no budget) or no access: no figures to show


def _print_dry_run(client: Client, spec: dict[str, Any], result: dict[str, Any],
                   mode: Output) -> None:
    """The one plain line (what the job spends of the limit, what is left), the plan's
    figures, the spec as it would run, and where the epsilons are explained."""
    if mode is Output.JSON:
        print_json(result)
        return
    budget = _dataset_budget(client, spec)
    console.print(dry_run_line(result, budget), highlight=False, soft_wrap=True)
    for text in result.get("warnings") or []:  # would run, probably not as meant
        err_console.print(f"warning: {text}", style="bold yellow", highlight=False,
                          soft_wrap=True)
    if mode is Output.QUIET:
        return
    print_rows(dry_run_rows(result), indent="  ")
    if result.get("spec"):
        console.print("the spec as it would run (defaults filled in):", highlight=False)
        console.print(yaml.safe_dump(result["spec"], sort_keys=False).rstrip(),
                      highlight=False, markup=False, soft_wrap=True)
    warning = spent_after_warning(result, budget)
    if warning:
        err_console.print(warning, style="bold yellow", highlight=False, soft_wrap=True)
    console.print(f"what these epsilons mean: {EPSILONS_DOC}", highlight=False)


def _warn_spent_after(client: Client, spec: dict[str, Any], result: dict[str, Any]) -> None:
    """A WARNING on stderr when the job takes the dataset past its warning fraction."""
    warning = spent_after_warning(result, _dataset_budget(client, spec) or {})
    if warning:
        err_console.print(warning, style="bold yellow", highlight=False, soft_wrap=True)


@app.command("list")
@cli_errors
def list_(ctx: typer.Context,
          state: Annotated[str | None, typer.Option(
              help="only jobs in this state: queued | running | succeeded | failed | "
              "cancelled")] = None,
          json_: JsonFlag = False) -> None:
    """All jobs of your tenant, newest first."""
    client = state_of(ctx).client()
    rows = list(client.list_jobs(state=state) if state else client.list_jobs())
    if json_:
        print_json(rows)
        return
    print_table([{**row, "name": job_name(row)} for row in rows],
                ["job_id", "name", "type", "state", "created_at"], "jobs")


@app.command("show")
@cli_errors
def show(ctx: typer.Context, job_id: JobIdArg, json_: JsonFlag = False) -> None:
    """One job: its state, the base model it starts from and the model or corpus it
    produced (once it succeeded), and its epsilons."""
    job = state_of(ctx).client().get_job(job_id)
    if json_:
        print_json(job)
        return
    print_rows(job_rows(job))


@app.command("cancel")
@cli_errors
def cancel(ctx: typer.Context, job_id: JobIdArg, json_: JsonFlag = False) -> None:
    """Ask for cancellation (steps already granted stay charged)."""
    job = state_of(ctx).client().cancel_job(job_id)
    if json_:
        print_json(job)
        return
    console.print(f"job {job.get('job_id', job_id)}: {job.get('state', '?')} (cancellation "
                  "asked; steps already granted stay charged)", highlight=False)


@app.command("watch")
@cli_errors
def watch(ctx: typer.Context, job_id: JobIdArg, poll: PollOption = 2.0,
          json_: Annotated[bool, typer.Option(
              "--json", help="print the finished job's JSON body")] = False,
          quiet: Annotated[bool, typer.Option(
              "--quiet", "-q", help="print only the id of what the job produced")] = False
          ) -> None:
    """A progress bar (on stderr) until the job ends; exits 1 unless it succeeded."""
    raise typer.Exit(watch_job(state_of(ctx).client(), job_id, poll=poll,
                               mode=output_mode(json_, quiet)))
