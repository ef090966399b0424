"""Job spec files and ``--set KEY=VALUE`` overrides of ``dpsynth jobs submit``.

A recipe in ``examples/`` holds placeholders for the ids a user only learns by running the
previous step; ``--set dataset_id=$PRIVATE --set privacy.target_epsilon=2`` fills them in
without editing the file. A dotted KEY walks (or makes) nested mappings; VALUE is read as a
YAML scalar, so ``2`` stays a number, ``true`` a bool and ``ds_1`` a string.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
import yaml
from dpsynth_shared.errors import DpsynthError, ErrorCode

_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec from a ``.yaml``/``.yml`` or ``.json`` file.

    Raises:
        DpsynthError: ``invalid_spec`` when the file is not YAML/JSON or not a mapping.
    """
    text = path.read_text()
    try:
        spec = yaml.safe_load(text) if path.suffix in {".yaml", ".yml"} else json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"{path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"{path} must hold a mapping (the job spec)")
    return spec


def parse_override(pair: str) -> tuple[list[str], Any]:
    """``"privacy.target_epsilon=2"`` → ``(["privacy", "target_epsilon"], 2)``.

    Raises:
        typer.BadParameter: without ``=``, with an empty key or key part, or with a value
            that is not a YAML scalar (a list or mapping belongs in the spec file).
    """
    key, sep, raw = pair.partition("=")
    parts = [part.strip() for part in key.split(".")]
    if not sep or not all(parts):
        raise typer.BadParameter(f"{pair!r} is not KEY=VALUE (e.g. dataset_id=ds_... or "
                                 "privacy.target_epsilon=2)", param_hint="--set")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not YAML (e.g. an unbalanced quote): the text as given
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-6 (no dot) as text; a number is meant
    if isinstance(value, dict | list):
        raise typer.BadParameter(f"{pair!r}: VALUE must be a single value (a number, a word, "
                                 "true/false); put lists and mappings in the spec file",
                                 param_hint="--set")
    return parts, value


def apply_overrides(spec: dict[str, Any], pairs: Iterable[str]) -> dict[str, Any]:
    """``spec`` with every ``KEY=VALUE`` of ``pairs`` set, in order (a copy; later wins).

    Raises:
        typer.BadParameter: for a malformed pair, or a dotted key crossing a value that is
            not a mapping (``privacy=2`` then ``privacy.target_epsilon=2``).
    """
    out = copy.deepcopy(spec)
    for pair in pairs:
        path, value = parse_override(pair)
        node = out
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[:depth + 1])
                raise typer.BadParameter(f"{pair!r}: {where} is {child!r} in the spec, not a "
                                         "mapping", param_hint="--set")
            node = child
        node[path[-1]] = value
    return out
