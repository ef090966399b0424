"""Api field names → what a CLI user types (issue 15, item 3: errors name what they can change).

The api names its fields (``on_overlap``, ``holdout_fraction``, ``privacy.target_epsilon``);
a CLI user typed flags (``--on-overlap link``) or wrote a job spec file. :class:`Vocabulary`
rewrites a problem's detail and field errors in the user's terms:

* a field that the running command has as an option becomes its flag (the option's own
  name, so the map follows the command's signature; :data:`ALIASES` where the api names it
  otherwise, e.g. ``evaluate``'s ``dp.target_epsilon`` is ``--dp-epsilon``);
* a field of an upload option, in an error of another command (``evaluate`` on a dataset
  uploaded without ``holdout_fraction``), becomes that flag and the command it belongs to;
* a command that submits a spec file names the spec key and the file.

In free text only snake_case names (or a name followed by a quoted value, ``on_overlap
'link'``) are rewritten: a plain word such as "name" or "delta" stays a word.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UPLOAD_COMMAND = "dpsynth datasets upload"

UPLOAD_FLAGS: dict[str, tuple[str, ...]] = {
    "name": ("--name",),
    "visibility": ("--visibility",),
    "epsilon_limit": ("--epsilon-limit",),
    "delta": ("--delta",),
    "label_domain": ("--label-domain",),
    "declared_size": ("--declared-size",),
    "size_epsilon": ("--size-epsilon",),
    "partitions_disjoint": ("--partitions-disjoint", "--partitions-overlap"),
    "class_sizes": ("--class-sizes",),
    "on_overlap": ("--on-overlap",),
    "on_duplicate": ("--on-duplicate",),
    "privacy_unit": ("--privacy-unit",),
    "subject_column": ("--subject-column",),
    "holdout_fraction": ("--holdout-fraction",),
    "holdout_key": ("--holdout-key",),
}
"""The api's upload metadata fields and the ``datasets upload`` flags that set them (a
boolean: the flag for true, then the one for false)."""

ALIASES: dict[str, dict[str, str]] = {
    "evaluate": {"dataset_id": "dataset", "feature_model_id": "feature_model",
                 "dp.target_epsilon": "dp_epsilon", "dp": "dp_epsilon",
                 "include_private_images": "no_private_images"},
    "derive": {"fraction": "split"},
    "release-class-sizes": {"target_epsilon": "epsilon"},
}
"""Per command (its name): api fields whose option has another name."""

FALSE_FLAGS: dict[str, str] = {"partitions_disjoint": "partitions_overlap"}
"""Boolean fields whose false value is an option of its own (``--partitions-overlap``)."""

SPEC_FILE_PARAMS = ("spec_file",)
"""Parameters holding a job spec file: its errors name the spec key and the file."""

_VALUE = r"""(?:(?::\s*|\s+|=)(?:'(?P<sq>[^']*)'|"(?P<dq>[^"]*)"|(?P<bool>true|false)\b))?"""


@dataclass(frozen=True)
class Vocabulary:
    """How the running command's user names the api's fields."""

    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Field → the running command's option strings (true flag first for a boolean)."""
    spec_file: str | None = None
    """The spec file the command submitted, if any."""

    @classmethod
    def of(cls, ctx: Any) -> Vocabulary:
        """The vocabulary of the command running in ``ctx`` (a click/typer context; empty
        without one). Duck-typed: typer vendors its own click."""
        command = getattr(ctx, "command", None)
        if command is None:
            return cls()
        options = {p.name: _option_strings(p) for p in getattr(command, "params", ())
                   if getattr(p, "param_type_name", "") == "option" and p.name}
        flags = dict(options)
        for api_name, false in FALSE_FLAGS.items():
            if api_name in options and false in options:
                flags[api_name] = (*options[api_name], *options[false])
        for api_name, param in ALIASES.get(getattr(command, "name", None) or "", {}).items():
            if param in options:
                flags[api_name] = options[param]
        params = getattr(ctx, "params", None) or {}
        spec = next((str(params[name]) for name in SPEC_FILE_PARAMS
                     if isinstance(params.get(name), str | Path)), None)
        return cls(flags=flags, spec_file=spec)

    def term(self, name: str) -> str:
        """How to name api field ``name`` (a flag, a spec key in its file, or itself)."""
        if name in self.flags:
            return self.flags[name][0]
        if self.spec_file is not None and name:
            return f"{name} in {self.spec_file}"
        if name in UPLOAD_FLAGS:
            return f"{UPLOAD_FLAGS[name][0]} (of `{UPLOAD_COMMAND}`)"
        head, _, rest = name.partition(".")
        if rest and (head in self.flags or head in UPLOAD_FLAGS):  # label_domain.2
            part = f"value {int(rest) + 1}" if rest.isdigit() else rest
            return f"{self.term(head)} ({part})"
        return name

    def text(self, text: str, fields: tuple[str, ...] = ()) -> str:
        """``text`` with each api field it names in the user's terms.

        Args:
            text: a problem's detail or one field error's message.
            fields: the fields the problem itself names (its ``field`` member, e.g. a spec
                key ``privacy.target_epsilon``): rewritten wherever they appear.
        """
        names = sorted({*self.flags, *UPLOAD_FLAGS, *fields}, key=len, reverse=True)
        for name in names:
            pattern = re.compile(r"(?<![\w.\-`])(?P<name>`?" + re.escape(name)
                                 + r"(?P<sub>(?:\.\w+)*)`?)(?![\w])" + _VALUE)
            text = pattern.sub(functools.partial(self._replace, name, named=name in fields),
                               text)
        return text

    def _replace(self, name: str, match: re.Match[str], *, named: bool) -> str:
        value = match.group("sq") if match.group("sq") is not None else match.group("dq")
        boolean = match.group("bool")
        if not (named or value is not None or boolean is not None or "_" in name):
            return match.group(0)  # a plain word ("name", "delta") stays a word
        flags = self.flags.get(name) or UPLOAD_FLAGS.get(name)
        if match.group("sub"):  # label_domain.0: a part of the field
            return match.group(0).replace(match.group("name"),
                                          self.term(name + match.group("sub")), 1)
        if flags is None:  # a spec key: the key in its file
            return match.group(0).replace(match.group("name"), self.term(name), 1)
        where = "" if name in self.flags else f" (of `{UPLOAD_COMMAND}`)"
        if boolean is not None:
            if boolean == "true":
                return flags[0] + where
            return (flags[1] if len(flags) > 1 else f"no {flags[0]}") + where
        return f"{flags[0]} {value}{where}" if value is not None else flags[0] + where


def _option_strings(param: Any) -> tuple[str, ...]:
    """An option's strings, its long ``--name`` first, then a boolean's flag for false
    (``--partitions-overlap``)."""
    opts = sorted(param.opts, key=lambda o: (not o.startswith("--"), -len(o)))
    return (*opts, *getattr(param, "secondary_opts", ()))


def field_lines(errors: Any, vocab: Vocabulary, detail: str = "") -> list[str]:
    """One line per field error of a problem's ``errors`` (its field in the user's terms,
    then its message), each once; a message about the whole object that the ``detail``
    already says is not repeated."""
    if not isinstance(errors, list):
        return []
    lines: list[str] = []
    for e in errors:
        if not isinstance(e, Mapping):
            continue
        name = e.get("field")
        if not isinstance(name, str):  # an older api: the raw location
            loc = [str(p) for p in e.get("loc") or () if p != "body"]
            name = ".".join(loc)
        if not name and str(e.get("msg", "")) in detail:
            continue
        msg = vocab.text(str(e.get("msg", "")))
        line = f"{vocab.term(name)}: {msg}" if name else msg
        if line not in lines:
            lines.append(line)
    return lines
