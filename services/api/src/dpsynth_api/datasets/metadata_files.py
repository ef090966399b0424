"""Label files of an image-folder upload: Hugging Face ``metadata.csv`` / ``metadata.jsonl``.

The Hugging Face ``imagefolder`` convention: a ``metadata.csv`` (header row) or a
``metadata.jsonl`` (one JSON object a line) beside the images, with a ``file_name`` column
holding each image's path RELATIVE TO THE METADATA FILE'S FOLDER (sub-folders allowed:
``images/cat/1.png``) and a label column, ``label`` unless the upload's ``label_column``
(CLI ``--label-column``) names another. Other columns (captions, ids, ...) are ignored.

A row is refused (by count; by line number for a public upload only, docs/privacy.md) when
it lacks a file name or a label, names a path outside its folder (absolute, or with ``..``:
the same rule as archive member names), names a file twice, or has a label that is not a
string or an integer. Integer labels are class names like any other (``"3"``).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import PurePosixPath
from typing import Any

from dpsynth_api.datasets.ingested import invalid

CSV_NAME, JSONL_NAME = "metadata.csv", "metadata.jsonl"
METADATA_NAMES = (CSV_NAME, JSONL_NAME)
"""The base names of a label file."""
FILE_NAME_COLUMN = "file_name"
DEFAULT_LABEL_COLUMN = "label"
_SHOWN_COLUMNS = 10


def is_metadata_file(member: str) -> bool:
    """Whether an archive member is a label file (by its base name)."""
    return member.rsplit("/", 1)[-1] in METADATA_NAMES


def relative_path(raw: str) -> str | None:
    """A ``file_name`` as a normalised relative posix path; None when it is empty or
    leaves its folder (absolute, a drive, or ``..``)."""
    text = raw.strip().replace("\\", "/")
    if not text or text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        return None
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


class _Rows:
    """The rows of one label file as they are read: the mapping and the bad lines."""

    def __init__(self, name: str, *, private: bool) -> None:
        self.name, self.private = name, private
        self.labels: dict[str, str] = {}
        self.bad: dict[str, list[int]] = {"incomplete": [], "outside": [], "twice": []}

    def add(self, line: int, file_name: Any, label: Any) -> None:
        if isinstance(label, bool) or not isinstance(label, str | int) or not isinstance(
                file_name, str):
            self.bad["incomplete"].append(line)
            return
        value = str(label).strip()
        path = relative_path(file_name)
        if not value or not file_name.strip():
            self.bad["incomplete"].append(line)
        elif path is None:
            self.bad["outside"].append(line)
        elif path in self.labels:
            self.bad["twice"].append(line)
        else:
            self.labels[path] = value

    def result(self, label_column: str) -> dict[str, str]:
        why = {"incomplete": f"lack a {FILE_NAME_COLUMN} or a {label_column} (a string or "
                             "an integer)",
               "outside": "name a path outside the metadata file's folder (absolute, or "
                          "with '..')",
               "twice": "name an image already named by an earlier row"}
        problems = [f"{len(lines)} row(s) {why[k]}" + ("" if self.private else
                                                      f" (first: line {lines[0]})")
                    for k, lines in self.bad.items() if lines]
        if problems:
            raise invalid(f"{self.name}: {'; '.join(problems)}; give each image exactly one "
                          "row with its file_name (relative to the metadata file's folder) "
                          "and its label")
        return self.labels


def _text(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid(f"{name} is not UTF-8 text") from exc


def _missing_columns(name: str, columns: list[str], label_column: str) -> None:
    missing = [c for c in (FILE_NAME_COLUMN, label_column) if c not in columns]
    if not missing:
        return
    found = ", ".join(repr(c) for c in columns[:_SHOWN_COLUMNS]) or "none"
    hint = (" (name the label column with label_column)"
            if label_column in missing else "")
    raise invalid(f"{name} needs the columns {FILE_NAME_COLUMN!r} and {label_column!r}; "
                  f"it lacks {', '.join(repr(c) for c in missing)}{hint}; its columns: "
                  f"{found}")


def _parse_csv(rows: _Rows, text: str, label_column: str) -> None:
    reader = csv.DictReader(io.StringIO(text))
    try:
        _missing_columns(rows.name, [c.strip() for c in reader.fieldnames or []], label_column)
        reader.fieldnames = [c.strip() for c in reader.fieldnames or []]
        for row in reader:
            rows.add(reader.line_num, row.get(FILE_NAME_COLUMN) or "",
                     row.get(label_column) or "")
    except csv.Error as exc:
        raise invalid(f"{rows.name} is not a readable CSV file") from exc


def _parse_jsonl(rows: _Rows, text: str, label_column: str) -> None:
    columns: dict[str, None] = {}
    objects: list[tuple[int, dict[str, Any]]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            rows.bad["incomplete"].append(line)
            continue
        columns.update(dict.fromkeys(str(k) for k in value))
        objects.append((line, value))
    if objects:
        _missing_columns(rows.name, list(columns), label_column)
    for line, value in objects:
        rows.add(line, value.get(FILE_NAME_COLUMN), value.get(label_column))


def parse_metadata_file(name: str, data: bytes, *, label_column: str = DEFAULT_LABEL_COLUMN,
                        private: bool) -> dict[str, str]:
    """``file_name`` (normalised, relative to the file's folder) -> label value.

    Args:
        name: the member's name (only its base name is ever shown).
        data: the file's bytes.
        label_column: the column holding the class name.
        private: whether errors must give counts only (no line numbers).

    Raises:
        DpsynthError: 422 ``invalid_dataset`` (not UTF-8, a missing column, bad rows, no row).
    """
    base = name.rsplit("/", 1)[-1]
    rows = _Rows(base, private=private)
    text = _text(base, data)
    if base == CSV_NAME:
        _parse_csv(rows, text, label_column)
    else:
        _parse_jsonl(rows, text, label_column)
    labels = rows.result(label_column)
    if not labels:
        raise invalid(f"{base} has no rows: give one row per image ({FILE_NAME_COLUMN}, "
                      f"{label_column})")
    return labels
