"""The ``dpsynth`` command line: the embedded platform, and every api operation."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from dpsynth_cli import admin, evaluate, jobs, ledger, models, resources, samples
from dpsynth_cli.common import CliState, console, err_console, print_json, state_of
from dpsynth_cli.config import locate_home, remember_platform, resolve_home
from dpsynth_cli.options import CliTyper, house_style
from dpsynth_cli.runtime_dir import ensure_runtime_dir

app = CliTyper(help="dpsynth: differentially private synthetic data. By default commands "
               "print lines for a person; --json prints the api's JSON, --quiet only the "
               "id of what was created.", pretty_exceptions_enable=False)
app.add_typer(admin.app, name="admin")
app.add_typer(resources.datasets, name="datasets")
app.add_typer(models.app, name="models")
app.add_typer(jobs.app, name="jobs")
app.add_typer(ledger.app, name="ledger")
app.command("budget")(resources.budget)
app.command("download")(models.download)
app.add_typer(evaluate.features, name="features")
app.command("evaluate")(evaluate.evaluate)
app.command("report")(evaluate.report)
app.add_typer(samples.app, name="samples")

HomeOption = Annotated[Path | None, typer.Option("--home", help="state folder (default: "
                                                  "$DPSYNTH_HOME, the nearest .dpsynth above, "
                                                  "the last `dpsynth up`, else ./.dpsynth)")]


@app.callback()
def root(ctx: typer.Context,
         api_url: Annotated[str | None, typer.Option("--api-url", help="api base URL")] = None,
         api_key: Annotated[str | None, typer.Option("--api-key", help="API key")] = None,
         home: HomeOption = None) -> None:
    """Options here apply to every command."""
    ctx.obj = CliState(api_url, api_key, home)


def _platform_home(ctx: typer.Context, home: Path | None) -> Path:
    """The embedded platform's state folder; also makes ``XDG_RUNTIME_DIR`` fit for the
    embedded PostgreSQL's lock before anything imports it (no RuntimeDirWarning)."""
    ensure_runtime_dir(os.environ)
    return resolve_home(home or state_of(ctx).home, os.environ)


@app.command("up")
def up(ctx: typer.Context, home: HomeOption = None,
       detach: Annotated[bool, typer.Option("--detach", "-d",
                                            help="return once ready, leave it running")] = False,
       api_port: Annotated[int | None, typer.Option(
           help="the api's port (default 8000 if free)")] = None,
       ledger_port: Annotated[int | None, typer.Option(
           help="the ledger's port (default 8001 if free)")] = None,
       workers: Annotated[int, typer.Option(min=1, help="worker processes")] = 1) -> None:
    """Start the embedded platform (PostgreSQL, Redis, ledger, api, workers)."""
    from dpsynth_cli.embedded import EmbeddedPlatform, PlatformError

    found = locate_home(home or state_of(ctx).home, os.environ)
    platform = EmbeddedPlatform(found.path, api_port=api_port,
                                ledger_port=ledger_port, workers=workers)
    here = found.origin in {"--home", "DPSYNTH_HOME", "default"} \
        or found.path.resolve() == (Path.cwd() / ".dpsynth").resolve()
    where = "" if here else f" ({found.origin}; --home ./.dpsynth starts a new one here)"
    console.print(f"starting the platform in {platform.home}{where} ...", highlight=False,
                  soft_wrap=True)
    try:
        state = platform.start()
    except PlatformError as exc:
        err_console.print(f"[bold red]error[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    remember_platform(platform.home, os.environ)  # found from any folder from now on
    console.print(f"api:         {state.api_url}\nledger:      {state.ledger_url}\n"
                  f"credentials: {platform.credentials_file}\n"
                  f"logs:        {platform.home / 'logs'}", highlight=False)
    if detach:
        console.print("running in the background; `dpsynth down` stops it", highlight=False)
        return
    console.print("press Ctrl-C to stop", highlight=False)

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        while platform.is_running():
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    console.print("stopping ...", highlight=False)
    platform.stop()


@app.command("down")
def down(ctx: typer.Context, home: HomeOption = None,
         timeout: Annotated[float, typer.Option(help="seconds before SIGKILL")] = 15.0) -> None:
    """Stop the embedded platform (state is kept for the next `up`)."""
    from dpsynth_cli.embedded import EmbeddedPlatform

    stopped = EmbeddedPlatform(_platform_home(ctx, home)).stop(timeout=timeout)
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"),
                  highlight=False)


@app.command("status")
def status(ctx: typer.Context, home: HomeOption = None,
           json_: Annotated[bool, typer.Option(
               "--json", help="print the status as JSON")] = False) -> None:
    """The embedded platform's processes and readiness; exits 3 when it is not running."""
    from dpsynth_cli.embedded import EmbeddedPlatform

    info = EmbeddedPlatform(_platform_home(ctx, home)).status()
    if json_:
        print_json(info)
    else:
        for line in status_lines(info):
            console.print(line, highlight=False, soft_wrap=True)
    if not info.get("running"):
        raise typer.Exit(3)


def status_lines(info: dict[str, Any]) -> list[str]:
    """``dpsynth status`` for a person: running or not, where, and each process."""
    lines = [f"platform in {info.get('home', '-')}: "
             + ("running" if info.get("running") else "not running (dpsynth up starts it)")]
    ready = info.get("ready") or {}
    for name in ("api", "ledger"):
        if info.get(f"{name}_url"):
            state = "ready" if ready.get(name) else "not ready"
            lines.append(f"{name + ':':<12} {info[f'{name}_url']} ({state})")
    if "postgres" in info:
        lines.append(f"{'postgres:':<12} {'running' if info['postgres'] else 'stopped'}")
    if info.get("credentials_file"):
        lines.append(f"{'credentials:':<12} {info['credentials_file']}")
    for name, proc in sorted((info.get("processes") or {}).items()):
        state = "running" if proc.get("running") else "stopped"
        lines.append(f"{name + ':':<12} pid {proc.get('pid')}, {state}, log {proc.get('log')}")
    return lines


house_style(app)  # last: every command registered above, whichever module made it

if __name__ == "__main__":  # pragma: no cover
    app()
