"""A problem's per-field ``errors``, each listed once and cleaned (issue 15, item 3): the
dotted path the user wrote and pydantic's message without its "Value error, " prefix and help
URL; the ``detail`` names the fields and does not repeat the messages."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dpsynth_shared.errors import DpsynthError

_PYDANTIC_PREFIX = re.compile(r"^(Value error|Assertion failed), ")
_PYDANTIC_URL = re.compile(r"\s*\[?\s*For further information visit https?://\S+\s*\]?\s*$")
_TAG_TYPES = {"union_tag_invalid", "union_tag_not_found"}


def clean_message(msg: str) -> str:
    """A validation message without pydantic's ``Value error, `` prefix and help URL."""
    return _PYDANTIC_URL.sub("", _PYDANTIC_PREFIX.sub("", str(msg))).strip()


def field_errors(raw: Iterable[Mapping[str, Any]], *, tag: str | None = None,
                 root: str = "body") -> list[dict[str, Any]]:
    """A problem's per-field ``errors`` from pydantic's (never the input: it may be private).

    Each entry keeps ``loc`` (the raw path) and ``type``, and carries ``field`` (the dotted
    path the user wrote: without the ``root`` of a request body and the ``tag`` of a
    discriminated union; ``type`` for a bad tag; "" for the object as a whole) and ``msg``
    (:func:`clean_message`).
    """
    out: list[dict[str, Any]] = []
    for e in raw:
        loc = [p for p in e.get("loc", ()) if isinstance(p, str | int)]
        path = list(loc)
        if path and path[0] == root:
            path = path[1:]
        if tag is not None and path and path[0] == tag:
            path = path[1:]
        entry: dict[str, Any] = {"loc": loc, "field": ".".join(str(p) for p in path),
                                 "msg": clean_message(str(e.get("msg", "")))}
        if e.get("type"):
            entry["type"] = str(e["type"])
            if entry["type"] in _TAG_TYPES and not entry["field"]:
                entry["field"] = "type"
        out.append(entry)
    return out


def field_errors_detail(head: str, errors: list[dict[str, Any]]) -> str:
    """A detail naming the invalid fields once (their messages are in ``errors`` only), then
    the messages about the object as a whole (they have no field to name)."""
    names = list(dict.fromkeys(e["field"] for e in errors if e.get("field")))
    whole = list(dict.fromkeys(str(e["msg"]) for e in errors if not e.get("field")))
    n = len(errors) - len([e for e in errors if not e.get("field")])
    listed = f" ({n} field error{'s' if n != 1 else ''}: {', '.join(names)})" if names else ""
    return head + listed + (": " + "; ".join(whole) if whole else "")


def with_clean_field_errors(error: DpsynthError) -> DpsynthError:
    """``error`` with its ``errors`` member cleaned (:func:`field_errors`) and its detail
    not repeating them: a detail ``"invalid metadata: a: msg; b: msg"`` becomes
    ``"invalid metadata (2 field errors: a, b)"`` (:func:`field_errors_detail`). Errors
    without such a list are returned as they are."""
    raw = error.extensions.get("errors")
    if not isinstance(raw, list) or not raw or not all(
            isinstance(e, Mapping) and "msg" in e for e in raw):
        return error
    if all("field" in e for e in raw):
        return error  # already clean
    errors = field_errors(raw)
    head = error.detail
    for e in raw:  # drop each "loc: msg" the producer appended to its detail
        head = re.sub(r"(?:[\w.\[\]-]+: )?" + re.escape(str(e["msg"])), "", head)
    head = re.sub(r"(?:;\s*)+", "; ", head).strip(" ;:") or "invalid request"
    return DpsynthError(error.code, field_errors_detail(head, errors),
                        **{**error.extensions, "errors": errors})


__all__ = ["clean_message", "field_errors", "field_errors_detail", "with_clean_field_errors"]
