"""What every CLI command shares: the client, error → exit-code mapping, printing."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import typer
from dpsynth_client import Client
from dpsynth_shared.errors import DpsynthError
from rich.console import Console
from rich.table import Table

from dpsynth_cli.config import resolve_config

console = Console()
err_console = Console(stderr=True)
P = ParamSpec("P")
R = TypeVar("R")


class CliState:
    """Global options, kept on the typer context."""

    def __init__(self, api_url: str | None, api_key: str | None, home: Path | None) -> None:
        self.api_url = api_url
        self.api_key = api_key
        self.home = home

    def client(self) -> Client:
        """A client for the resolved api URL and key."""
        cfg = resolve_config(api_url=self.api_url, api_key=self.api_key, env=os.environ,
                             home=self.home)
        return Client(cfg.api_url, cfg.api_key)


def state_of(ctx: typer.Context) -> CliState:
    """The :class:`CliState` the root callback stored (a default one in isolation)."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, CliState) else CliState(None, None, None)


def exit_code_for(err: DpsynthError) -> int:
    """2 for client errors (4xx), 1 for everything else."""
    return 2 if 400 <= err.status < 500 else 1


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Print a DpsynthError's code and detail and exit 2 (4xx) or 1 (other)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DpsynthError as err:
            err_console.print(f"[bold red]error[/] [{err.status}] {err.code}: {err.detail}",
                              highlight=False, markup=True)
            for key, value in err.extensions.items():
                err_console.print(f"  {key}: {value}", highlight=False, markup=False)
            raise typer.Exit(exit_code_for(err)) from None

    return wrapper


def print_json(data: Any) -> None:
    """Pretty JSON on stdout."""
    console.print_json(json.dumps(data, default=str))


def print_table(rows: Iterable[dict[str, Any]], columns: list[str], title: str) -> int:
    """A table of ``columns`` from ``rows``; returns the number of rows."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    n = 0
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
        n += 1
    console.print(table)
    return n
