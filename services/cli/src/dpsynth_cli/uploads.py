"""What ``dpsynth datasets upload`` checks and prepares on the user's machine, before a byte
is sent (issue 15, items 3 and 5; docs/datasets.md).

* :func:`prepare_upload`: a file of no accepted format is refused with the api's own
  sentence and code (:mod:`dpsynth_shared.upload_formats`); a FOLDER (``<label>/<image>``,
  Hugging Face ``train/<label>/…`` + ``test/<label>/…``, or images with a
  ``metadata.csv`` / ``metadata.jsonl``) is zipped, in a fixed order, without hidden files
  (``.DS_Store``, ``.git/``, ``__MACOSX/``), into a temporary zip whose path is returned;
  :func:`prepared_upload` removes it afterwards.
* :func:`check_labels`: the label values of a folder or zip that are not in
  ``--label-domain``, named (the first few, sorted, and how many). The api does not echo a
  PRIVATE upload's label values (docs/privacy.md: they are its data, and a response may be
  kept by proxies), so the names come from here, computed from the user's own files.

The layouts are read from file names only, the way the api reads them
(``dpsynth_api.datasets.folders``); anything this cannot tell is left to the api.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.upload_formats import format_of, unsupported_format

__all__ = ["check_labels", "folder_files", "label_values", "prepare_upload",
           "prepared_upload", "zip_folder"]

_HIDDEN_NAMES = frozenset({"__MACOSX", "thumbs.db", "desktop.ini"})
_REPOSITORY_FILES = frozenset({"readme.md", "readme.txt", "readme", "license", "license.md",
                               "license.txt"})  # sent, and ignored by the api at the root
_METADATA = ("metadata.csv", "metadata.jsonl")
_SPLITS = ("train", "test", "validation")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # every member's time: the same folder, the same zip
_MAX_METADATA_BYTES = 64 << 20
_SHOWN = 5
UPLOAD_NAME = "upload.zip"
"""The name a zipped folder is sent under (the folder's own name is not sent)."""


def _hidden(name: str) -> bool:
    return name.startswith(".") or name in _HIDDEN_NAMES or name.lower() in _HIDDEN_NAMES


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """The files a folder upload sends: ``(posix path relative to the folder, path)``,
    sorted by relative path; hidden files and folders skipped, folder links not followed."""
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in files:
            path = Path(root) / name
            if not _hidden(name) and path.is_file():
                found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def zip_folder(folder: Path, dest: Path) -> Path:
    """Zip ``folder``'s files (:func:`folder_files`) into ``dest``, deterministically: the
    same files give the same bytes (sorted names, fixed times and modes).

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when the folder has no file to send.
    """
    files = folder_files(folder)
    if not files:
        raise DpsynthError(ErrorCode.INVALID_DATASET, f"the folder {folder} has no files to "
                           "upload (hidden files are skipped)")
    with zipfile.ZipFile(dest, "w") as zf:
        for name, path in files:
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            big = path.stat().st_size >= 0x7FFFFFFF
            with path.open("rb") as src, zf.open(info, "w", force_zip64=big) as out:
                shutil.copyfileobj(src, out, 1 << 20)
    return dest


def prepare_upload(path: Path, *, workdir: Path | None = None) -> Path:
    """The file to send for ``path``: the file itself when its format is accepted, or, for
    a folder, a new zip of it (in a new temporary folder under ``workdir``; the caller
    removes it, or uses :func:`prepared_upload`).

    Raises:
        DpsynthError: 422 ``invalid_archive`` naming every accepted format (the api's code
            and sentence) for a file of another format; 422 ``invalid_dataset`` for an
            empty folder; 400 ``invalid_request`` when nothing is at ``path``.
    """
    if path.is_dir():
        staging = Path(tempfile.mkdtemp(prefix="dpsynth-upload-", dir=workdir))
        try:
            return zip_folder(path, staging / UPLOAD_NAME)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    if not path.is_file():
        raise DpsynthError(ErrorCode.INVALID_REQUEST, f"{path}: no such file or folder")
    if format_of(path.name) is None:
        raise unsupported_format(path.name, folders=True)
    return path


@contextmanager
def prepared_upload(path: Path, *, workdir: Path | None = None) -> Iterator[Path]:
    """:func:`prepare_upload` as a ``with`` block: a zip made of a folder is deleted at
    its end, whatever happens."""
    sent = prepare_upload(path, workdir=workdir)
    try:
        yield sent
    finally:
        if sent != path:
            shutil.rmtree(sent.parent, ignore_errors=True)


def _labels_in_metadata(name: str, data: bytes, column: str) -> set[str] | None:
    try:
        text = data.decode("utf-8-sig")
        if name.endswith(".csv"):
            reader = csv.DictReader(io.StringIO(text))
            fields = [f.strip() for f in reader.fieldnames or []]
            if column not in fields:
                return None
            reader.fieldnames = fields
            return {str(row.get(column) or "").strip() for row in reader} - {""}
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (UnicodeDecodeError, csv.Error, ValueError):
        return None
    values = {r.get(column) for r in rows if isinstance(r, dict)}
    return {str(v).strip() for v in values
            if isinstance(v, str | int) and not isinstance(v, bool)} - {""}


def _names_and_reader(path: Path) -> tuple[list[str], dict[str, bytes]] | None:
    """The file names of a folder or a zip, and its label files' bytes; None otherwise."""
    if path.is_dir():
        files = folder_files(path)
        meta = {n: p.read_bytes() for n, p in files
                if n.rsplit("/", 1)[-1] in _METADATA and p.stat().st_size <= _MAX_METADATA_BYTES}
        return [n for n, _ in files], meta
    if not (path.is_file() and path.name.lower().endswith(".zip")):
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            names = [i.filename.replace("\\", "/").lstrip("/") for i in infos]
            meta = {n: zf.read(i) for n, i in zip(names, infos, strict=True)
                    if n.rsplit("/", 1)[-1] in _METADATA and i.file_size <= _MAX_METADATA_BYTES}
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
        return None  # the api says what is wrong with it
    return names, meta


def label_values(path: Path, *, label_column: str | None = None) -> set[str] | None:
    """The label values of a folder or zip upload, from its file names (class folders,
    split folders) or its label files; None when this cannot tell (other formats, an
    unreadable label file: the api checks those)."""
    found = _names_and_reader(path)
    if found is None:
        return None
    names, meta = found
    names = [n for n in names if not any(_hidden(p) for p in n.split("/"))
             and not ("/" not in n and n.lower() in _REPOSITORY_FILES)]
    if any(n.rsplit("/", 1)[-1] in _METADATA for n in names):
        labels: set[str] = set()
        for name, data in meta.items():
            values = _labels_in_metadata(name, data, label_column or "label")
            if values is None:
                return None
            labels |= values
        return labels
    parts = [n.split("/") for n in names if n.rsplit("/", 1)[-1] != "subjects.csv"]
    while (parts and all(len(p) >= 3 for p in parts) and len({p[0] for p in parts}) == 1
           and parts[0][0] not in _SPLITS):
        parts = [p[1:] for p in parts]
    if parts and {p[0] for p in parts} <= set(_SPLITS) and all(len(p) == 3 for p in parts):
        return {p[1] for p in parts}
    if parts and all(len(p) == 2 for p in parts):
        return {p[0] for p in parts}
    return None


def check_labels(path: Path, label_domain: list[str] | None, *,
                 label_column: str | None = None) -> None:
    """Refuse, before uploading, a folder or zip whose labels are not all in
    ``label_domain``, naming the first few unknown values (sorted) and how many there are.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` with ``unknown_labels`` and
            ``unknown_label_count``.
    """
    if not label_domain:
        return
    labels = label_values(path, label_column=label_column)
    if labels is None:
        return
    outside = sorted(labels - set(label_domain))
    if not outside:
        return
    shown = outside[:_SHOWN]
    more = f" and {len(outside) - len(shown)} more" if len(outside) > len(shown) else ""
    raise DpsynthError(
        ErrorCode.INVALID_DATASET,
        f"{len(outside)} label value(s) of {path.name} are not in --label-domain: "
        f"{', '.join(repr(v[:40]) for v in shown)}{more}; add them to --label-domain, or "
        "leave their images out of the upload",
        unknown_labels=shown, unknown_label_count=len(outside))
