"""What the commands share on their command line: the ``--json`` / ``--quiet`` output modes,
the confirmation of irreversible admin commands, and a Typer whose help shows flags as flags.

The scripting contract (issue 15): by default a command prints lines for a person; ``--json``
prints exactly the api's body; ``--quiet`` prints only the id of what was created, so
``X=$(dpsynth ...)`` keeps it. Progress bars, spinners and warnings go to stderr in every
mode, so stdout holds nothing else.
"""

from __future__ import annotations

import inspect
import sys
from enum import Enum
from typing import Annotated, Any

import typer
import typer.core

JsonFlag = Annotated[bool, typer.Option(
    "--json", help="print the api's JSON body instead of the summary")]
YesFlag = Annotated[bool, typer.Option(
    "--yes", help="do not ask for confirmation (needed without a terminal)")]
PollOption = Annotated[float, typer.Option(
    help="seconds between polls of the job's state")]


class Output(Enum):
    """How a command prints its result."""

    HUMAN = "human"
    JSON = "json"
    QUIET = "quiet"


def output_mode(json_: bool, quiet: bool = False) -> Output:
    """The mode chosen by ``--json`` / ``--quiet`` (they exclude each other).

    Raises:
        typer.BadParameter: when both are given.
    """
    if json_ and quiet:
        raise typer.BadParameter("give --json or --quiet, not both", param_hint="--quiet")
    if json_:
        return Output.JSON
    return Output.QUIET if quiet else Output.HUMAN


def print_id(identifier: Any) -> None:
    """The bare id on stdout, nothing else (no colour, no wrapping): ``--quiet``'s output."""
    typer.echo(str(identifier))


def stdin_is_terminal() -> bool:
    """Whether a person can answer a question on stdin."""
    return sys.stdin.isatty()


def confirm_irreversible(action: str, *, yes: bool) -> None:
    """Ask before an irreversible change of platform state; ``--yes`` skips the question.

    Without a terminal to ask on (a script, a pipe) and without ``--yes`` the command is
    refused rather than run unconfirmed.

    Raises:
        typer.Exit: 2 when refused without a terminal; click's Abort when the user says no.
    """
    if yes:
        return
    if not stdin_is_terminal():
        typer.echo(f"refused: {action}. This cannot be undone; no terminal to confirm on: "
                   "run it again with --yes to confirm.", err=True)
        raise typer.Exit(2)
    typer.confirm(f"{action}. This cannot be undone. Continue?", abort=True, err=True)


def _flags_without_type(params: list[Any]) -> list[Any]:
    """Drop the value type Typer's help prints beside an on/off flag (``--watch <bool>``
    reads as if the flag took a value): an empty metavar prints nothing."""
    for param in params:
        if (isinstance(param, typer.core.TyperOption) and param.is_flag
                and param.metavar is None):
            param.metavar = ""
    return params


def reflowed(help_text: str | None) -> str | None:
    """A docstring with each paragraph on one line, so the terminal wraps it: Typer's rich
    mode keeps the source's line breaks, which cut sentences mid-line at 80 columns. A
    paragraph starting with ``\\b`` (click's "keep as is" mark) is kept as it is."""
    if not help_text:
        return help_text
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class FlagsAsFlagsCommand(typer.core.TyperCommand):
    """A command whose help shows on/off flags (``--watch``, ``--help``) as flags, listed in
    its group by the first paragraph of its docstring on one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflowed(self.help)
        if self.short_help is None and self.help:
            self.short_help = self.help.split("\n\n")[0]

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


class FlagsAsFlagsGroup(typer.core.TyperGroup):
    """A command group whose help shows on/off flags as flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


class CliTyper(typer.Typer):
    """``typer.Typer`` that shows its help when called without a command; its commands get
    :class:`FlagsAsFlagsCommand` from :func:`house_style` once the app is assembled."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("cls", FlagsAsFlagsGroup)
        super().__init__(**kwargs)


def house_style(app: typer.Typer) -> None:
    """Give every group and command registered under ``app`` (recursively) the classes
    above, also those of modules that build a plain ``typer.Typer``; a class other than
    Typer's default is kept."""
    if not isinstance(app.info.cls, type) or app.info.cls is typer.core.TyperGroup:
        app.info.cls = FlagsAsFlagsGroup  # not a type: Typer's "not given" placeholder
    for info in app.registered_commands:
        if info.cls in (None, typer.core.TyperCommand):
            info.cls = FlagsAsFlagsCommand
    for group in app.registered_groups:
        if isinstance(group.typer_instance, typer.Typer):
            house_style(group.typer_instance)
