"""What every CLI command shares: the client, error → exit-code mapping, printing.

An error prints ``error [status] code: detail`` once, in the user's terms (the flags of the
running command, or the spec key and file: :mod:`dpsynth_cli.flags`), then each field error
once and the numbers a user can act on; "no api configured" (nothing was sent) prints
``error: message`` without a status.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import typer
from dpsynth_client import Client
from dpsynth_client.errors import NotConfigured
from dpsynth_shared.errors import DpsynthError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dpsynth_cli.config import resolve_config
from dpsynth_cli.flags import Vocabulary, field_lines

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


_NOT_PRINTED = {"errors", "field", "refusal", "accumulators", "admission_order"}
"""Problem members shown otherwise (the field lines, the detail, the title) or only of use
to an auditor; ``rdp_*`` too (the filter's internal units)."""


def error_lines(err: DpsynthError, vocab: Vocabulary | None = None) -> list[str]:
    """What the CLI prints for ``err``: the headline, each field error once, the numbers."""
    vocab = vocab or Vocabulary()
    named = err.extensions.get("field")
    fields = (named,) if isinstance(named, str) and named else ()
    lines = [f"[{err.status}] {err.code}: {vocab.text(err.detail, fields)}"]
    lines += [f"  {line}" for line in field_lines(err.extensions.get("errors"), vocab,
                                                      err.detail)]
    suggested = err.extensions.get("suggested_target_epsilon")
    if fields and suggested is not None:  # the advice as the user would type it
        if fields[0] in vocab.flags:
            lines.append(f"  to follow it: {vocab.flags[fields[0]][0]} {suggested}")
        elif vocab.spec_file and "set_" in vocab.flags:
            lines.append(f"  to follow it: {vocab.flags['set_'][0]} {fields[0]}={suggested}")
    for key, value in err.extensions.items():
        if key in _NOT_PRINTED or key.startswith("rdp_") or value is None:
            continue
        lines.append(f"  {key}: {value}")
    return lines


def _context_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The command's context among its arguments (every command takes ``ctx``); duck-typed,
    as typer passes its vendored click's context, not an instance of ``typer.Context``."""
    return next((a for a in (*args, *kwargs.values())
                 if hasattr(a, "command") and hasattr(a, "params") and hasattr(a, "find_root")),
                None)


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Print a DpsynthError (:func:`error_lines`) and exit 2 (4xx) or 1 (other); print a
    :class:`~dpsynth_client.errors.NotConfigured` as ``error: message`` and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except NotConfigured as exc:
            err_console.print(Text.assemble(("error", "bold red"), f": {exc.message}"),
                              soft_wrap=True)
            raise typer.Exit(2) from None
        except DpsynthError as err:
            vocab = Vocabulary.of(_context_of(args, kwargs))
            first, *rest = error_lines(err, vocab)
            err_console.print(Text.assemble(("error", "bold red"), f" {first}"),
                              soft_wrap=True)
            for line in rest:
                err_console.print(line, highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(exit_code_for(err)) from None

    return wrapper


def print_rows(rows: Iterable[tuple[str, str]], *, indent: str = "",
               styles: dict[str, str] | None = None) -> None:
    """Label / value lines with the values aligned (the human view of one object: a job, a
    budget, a model, a dry run's plan); ``styles`` by label, e.g. the budget's warning."""
    rows = list(rows)
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        console.print(f"{indent}{label:<{width}}  {value}", style=(styles or {}).get(label, ""),
                      highlight=False, markup=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Pretty JSON on stdout."""
    console.print_json(json.dumps(data, default=str))


def print_table(rows: Iterable[dict[str, Any]], columns: list[str], title: str) -> int:
    """A table of ``columns`` from ``rows``; returns the number of rows.

    Ids (columns named ``*_id``) are never shortened or broken, so a user can copy them from
    the list (the other columns wrap when the terminal is narrow)."""
    cells = [["" if row.get(c) is None else str(row.get(c)) for c in columns] for row in rows]
    table = Table(title=title)
    for i, col in enumerate(columns):
        if col.endswith("_id"):
            width = max([len(col), *(len(r[i]) for r in cells)])
            table.add_column(col, no_wrap=True, min_width=width)
        else:
            table.add_column(col, overflow="fold")
    for r in cells:
        table.add_row(*r)
    console.print(table)
    return len(cells)
