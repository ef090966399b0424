"""Image-folder archives (zip, tar): the three layouts and their labels (docs/datasets.md).

Detected from the member names, after hidden files (``.DS_Store``, ``__MACOSX/``), a few
repository files (``README.md``, ``LICENSE``) and, for a subject upload, the root
``subjects.csv`` are set aside, and one common top folder is stripped:

* **class folders** ``<label>/<image>``;
* **Hugging Face splits** ``<split>/<label>/<image>`` with ``<split>`` one of ``train``,
  ``test``, ``validation``;
* **label files**: images anywhere, labelled by the ``metadata.csv`` / ``metadata.jsonl``
  of a folder above them (``datasets/metadata_files.py``), split folders allowed.

Split folders and the held-out part (docs/privacy.md, "Held-out and derived splits are
1-stable"): an archive with two or more split folders (``train/`` and ``test/``) must say,
with the upload option ``holdout_from`` (CLI ``--holdout-from``), which split is held out;
without it such an upload is refused, so a test set is never trained on by accident (one
split folder alone is simply the dataset). Each image's side is
then the folder its owner put it in before uploading: a function of that image alone, chosen
before any job ran, so the split is 1-stable like the keyed hash of ``holdout_fraction`` and
nothing about the data decides it. The other split folders are training data.

Every member is read through :class:`~dpsynth_api.archives.SafeArchive` (names, types, counts
and inflated bytes checked before and while reading) and every image is decoded under the
pixel and decoded-size caps, whatever the layout. Errors of a private upload name no member
(counts only).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from dpsynth_api.archives import SafeArchive, describe
from dpsynth_api.datasets import limits as bounds
from dpsynth_api.datasets.ingested import (
    DecodedSize,
    Ingested,
    IngestLimits,
    class_names_for,
    decode_checked,
    invalid,
    parse_subjects,
    stack_images,
)
from dpsynth_api.datasets.metadata_files import (
    DEFAULT_LABEL_COLUMN,
    METADATA_NAMES,
    is_metadata_file,
    parse_metadata_file,
)

SPLITS = ("train", "test", "validation")
"""The Hugging Face split folders recognised at the top of an archive."""
HOLDOUT_SPLITS = ("test", "validation")
"""The splits ``holdout_from`` may name."""
SUBJECTS_CSV = "subjects.csv"
"""An image-folder archive's subject map at its root: header ``path,subject``."""
_IGNORED_PARTS = ("__MACOSX",)
_IGNORED_NAMES = frozenset({"thumbs.db", "desktop.ini"})  # operating-system files, anywhere
_REPOSITORY_FILES = frozenset({"readme.md", "readme.txt", "readme", "license", "license.md",
                               "license.txt"})
"""A dataset repository's own files, ignored at the archive's root only: inside a class
folder a file that is no image is an error (``invalid_image``), not something to skip."""


@dataclass(frozen=True)
class LayoutOptions:
    """The upload options that read an image-folder archive.

    Attributes:
        holdout_from: the split folder (``test`` or ``validation``) whose images are the
            held-out part; None: no declared split.
        label_column: the label column of ``metadata.csv`` / ``metadata.jsonl`` (None:
            ``label``).
    """

    holdout_from: str | None = None
    label_column: str | None = None


def visible(name: str) -> bool:
    """Not a hidden file or folder, a macOS resource fork, an operating-system file, or a
    repository file (README, LICENSE) at the archive's root."""
    parts = name.split("/")
    return not (any(p.startswith(".") or p in _IGNORED_PARTS for p in parts)
                or parts[-1].lower() in _IGNORED_NAMES
                or (len(parts) == 1 and parts[0].lower() in _REPOSITORY_FILES))


def strip_root(names: list[list[str]], *, min_depth: int = 3) -> list[list[str]]:
    """``data/cat/1.png`` -> ``cat/1.png`` while every file sits under one top folder that
    is no split folder (and keeps at least ``min_depth - 1`` parts)."""
    while (names and all(len(p) >= min_depth for p in names)
           and len({p[0] for p in names}) == 1 and names[0][0] not in SPLITS):
        names = [p[1:] for p in names]
    return names


def _split_layout(parts: list[list[str]], *, labelled_by_files: bool) -> bool:
    """Whether the (stripped) paths are Hugging Face split folders."""
    if not parts or not {p[0] for p in parts} <= set(SPLITS):
        return False
    if labelled_by_files:
        return all(len(p) >= 2 for p in parts)
    if any(len(p) == 3 for p in parts):
        if not all(len(p) == 3 for p in parts):
            bad = sum(len(p) != 3 for p in parts)
            raise invalid(f"{bad} file(s) of the split folders are not inside exactly one "
                          "class folder: expected <split>/<class>/<image> (train/<class>/…, "
                          "test/<class>/…)")
        return True
    return False  # train/1.png, test/2.png: class folders named like splits


def check_splits(present: set[str], holdout_from: str | None) -> None:
    """The split folders of an archive against the upload's ``holdout_from``.

    Raises:
        DpsynthError: 422 ``invalid_dataset``: two or more splits and no ``holdout_from``;
            a ``holdout_from`` split that is absent; a ``test/`` folder that would be
            trained on; no training split.
    """
    listed = ", ".join(f"{s}/" for s in SPLITS if s in present)
    if holdout_from is None:
        if len(present) > 1:
            raise invalid(f"the archive has the split folders {listed}: say which one is the "
                          "held-out part with holdout_from 'test'; its "
                          "images are then never trained on. Or upload only the folders to "
                          "train on", split_folders=sorted(present))
        return
    if not present:
        raise invalid(f"holdout_from {holdout_from!r} needs split folders "
                      f"(train/<class>/…, {holdout_from}/<class>/…); this archive has none: "
                      "use holdout_fraction to hold out a share of it")
    if holdout_from not in present:
        raise invalid(f"holdout_from {holdout_from!r}: the archive has no {holdout_from}/ "
                      f"folder (its split folders: {listed})", split_folders=sorted(present))
    if "test" in present and holdout_from != "test":
        raise invalid(f"holdout_from {holdout_from!r} would train on the test/ folder; hold "
                      "out test/ (holdout_from 'test') or leave it out of the upload",
                      split_folders=sorted(present))
    if present == {holdout_from}:
        raise invalid(f"every image is in the held-out folder {holdout_from}/: the training "
                      "part needs a train/ folder", split_folders=sorted(present))


@dataclass
class _Plan:
    """An archive's files sorted out before any byte is read."""

    images: list[str]
    stripped: dict[str, str]  # member -> path after the common top folder
    split_of: dict[str, str | None]
    label_of: dict[str, str] | None  # class folders: known now; label files: after reading
    metadata: list[str]
    subjects_csv: str | None


def _plan(archive: SafeArchive, *, subjects: bool, options: LayoutOptions) -> _Plan:
    files = [m.name for m in archive.members if visible(m.name)]
    csv_name = None
    if subjects:
        files, csv_name = _split_subjects_csv(files)
        if csv_name is None:
            raise invalid(f"privacy_unit 'subject' needs a {SUBJECTS_CSV} (header "
                          "'path,subject') at the archive root, one line per image")
    metadata = [f for f in files if is_metadata_file(f)]
    images = [f for f in files if not is_metadata_file(f)]
    if not images:
        raise invalid("the archive contains no image files")
    if options.label_column is not None and not metadata:
        raise invalid("label_column names the label column of a "
                      f"{' or '.join(METADATA_NAMES)}; this archive has none (its labels "
                      "are its class folders)")
    by_files = bool(metadata)
    parts = strip_root([f.split("/") for f in images], min_depth=2 if by_files else 3)
    split = _split_layout(parts, labelled_by_files=by_files)
    split_of = {f: (p[0] if split else None) for f, p in zip(images, parts, strict=True)}
    check_splits({s for s in split_of.values() if s is not None}, options.holdout_from)
    label_of = None
    if not by_files:
        classes = [p[1:] if split else p for p in parts]
        if any(len(p) != 2 for p in classes):
            bad = sum(len(p) != 2 for p in classes)
            raise invalid(f"{bad} file(s) are not inside exactly one class folder: expected "
                          "<class>/<image> (one sub-folder per class), train/<class>/<image>, "
                          "or images labelled by a metadata.csv / metadata.jsonl")
        label_of = {f: p[0] for f, p in zip(images, classes, strict=True)}
    return _Plan(images, {f: "/".join(p) for f, p in zip(images, parts, strict=True)},
                 split_of, label_of, metadata, csv_name)


def read_image_folder(archive: SafeArchive, *, label_domain: list[str] | None,
                      limits: IngestLimits, subjects: bool = False,
                      options: LayoutOptions | None = None) -> Ingested:
    """Decode an image-folder archive to canonical arrays, in archive order.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` (layout, labels, label files, splits),
            ``invalid_image``, ``unsafe_archive``.
    """
    options = options or LayoutOptions()
    private = archive.private
    plan = _plan(archive, subjects=subjects, options=options)
    index: dict[str, int] | None = None
    if plan.label_of is not None:  # refuse unknown classes before decoding anything
        index = _class_index(set(plan.label_of.values()), label_domain, limits,
                             private=private)
    wanted = set(plan.images)
    texts: dict[str, bytes] = {}
    arrays: list[np.ndarray] = []
    names: list[str] = []
    decoded = DecodedSize(limits)
    for name, data in archive.iter_files():
        if name == plan.subjects_csv or name in plan.metadata:
            texts[name] = data
        elif name in wanted:
            arrays.append(decoded.add(decode_checked(
                data, limits, where=describe(name, private=private), private=private)))
            names.append(name)
    label_of = plan.label_of
    if label_of is None:
        label_of = _labels_from_files(plan, texts, options, private=private)
        index = _class_index(set(label_of.values()), label_domain, limits, private=private)
    assert index is not None
    dense, subject_ids = None, None
    if plan.subjects_csv is not None:
        dense, subject_ids = _folder_subjects(texts.get(plan.subjects_csv, b""), names,
                                              plan.stripped)
    held = None
    if options.holdout_from is not None:
        held = np.asarray([plan.split_of[n] == options.holdout_from for n in names], dtype=bool)
    return Ingested(stack_images(arrays, private=private),
                    np.asarray([index[label_of[n]] for n in names], dtype=np.int64),
                    list(index), archive.kind, subjects=dense, subject_ids=subject_ids,
                    held=held)


def _class_index(found: set[str], label_domain: list[str] | None, limits: IngestLimits, *,
                 private: bool) -> dict[str, int]:
    bounds.check_class_count(len(found), limits.max_classes)
    return {c: i for i, c in enumerate(class_names_for(found, label_domain, private=private))}


def _labels_from_files(plan: _Plan, texts: dict[str, bytes], options: LayoutOptions, *,
                       private: bool) -> dict[str, str]:
    """Each image's label from the label files: a file labels the images under its folder,
    by ``file_name`` relative to that folder.

    Raises:
        DpsynthError: 422 ``invalid_dataset``: an image without a row, a row naming no image
            of the archive, an image named twice, or two label files in one folder.
    """
    column = options.label_column or DEFAULT_LABEL_COLUMN
    folders = [m.rsplit("/", 1)[0] if "/" in m else "" for m in plan.metadata]
    if len(set(folders)) != len(folders):
        raise invalid("a folder has both a metadata.csv and a metadata.jsonl; keep one")
    images = set(plan.images)
    label_of: dict[str, str] = {}
    unknown = twice = 0
    for member, folder in zip(plan.metadata, folders, strict=True):
        rows = parse_metadata_file(member, texts.get(member, b""), label_column=column,
                                   private=private)
        for path, label in rows.items():
            target = f"{folder}/{path}" if folder else path
            if target not in images:
                unknown += 1
            elif target in label_of:
                twice += 1
            else:
                label_of[target] = label
    missing = len(images) - len(label_of)
    if unknown or twice or missing:
        problems = [text for count, text in (
            (missing, f"{missing} image(s) have no row in a metadata file above them"),
            (unknown, f"{unknown} row(s) name a file that is no image of the archive"),
            (twice, f"{twice} image(s) are named by two metadata files")) if count]
        raise invalid(f"{'; '.join(problems)}: every image needs exactly one row (file_name "
                      "relative to the metadata file's folder, and its label)",
                      images_without_row=missing, rows_without_image=unknown)
    return label_of


def _split_subjects_csv(files: list[str]) -> tuple[list[str], str | None]:
    """Take the root ``subjects.csv`` (or ``<top>/subjects.csv`` when every file sits in
    ``<top>/``) out of an archive's files; return (the other files, the csv's name)."""
    found = [f for f in files if f == SUBJECTS_CSV or (
        f.count("/") == 1 and f.endswith("/" + SUBJECTS_CSV))]
    if not found:
        return files, None
    if len(found) > 1:
        raise invalid(f"the archive has more than one {SUBJECTS_CSV} at its root")
    name = found[0]
    rest = [f for f in files if f != name]
    top = name[: -len(SUBJECTS_CSV)]
    if top and not all(f.startswith(top) for f in rest):
        return files, None  # <class>/subjects.csv: not the archive root's map
    return rest, name


def _parse_subjects_csv(data: bytes, *, column: str = "subject") -> dict[str, str]:
    """``path -> raw subject id`` from ``subjects.csv`` (header ``path,subject``).

    Raises:
        DpsynthError: 422 ``invalid_dataset``; the detail gives line counts only.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid(f"{SUBJECTS_CSV} is not UTF-8 text") from exc
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "path" not in reader.fieldnames or (
            column not in reader.fieldnames):
        raise invalid(f"{SUBJECTS_CSV} needs a header with the columns 'path' and "
                      f"'{column}'")
    mapping: dict[str, str] = {}
    duplicates = empty = 0
    for row in reader:
        path = (row.get("path") or "").strip().replace("\\", "/")
        while path.startswith("./"):
            path = path[2:]
        path = path.lstrip("/")
        subject = (row.get(column) or "").strip()
        if not path or not subject:
            empty += 1
            continue
        if path in mapping:
            duplicates += 1
        mapping[path] = subject
    if empty or duplicates:
        raise invalid(f"{SUBJECTS_CSV}: {empty} line(s) lack a path or a subject and "
                      f"{duplicates} path(s) are listed twice; give each image exactly one "
                      "subject")
    return mapping


def _folder_subjects(csv_data: bytes, names: list[str],
                     stripped: dict[str, str]) -> tuple[np.ndarray, list[str]]:
    """Each image's dense subject index from ``subjects.csv`` (and each index's normalised
    raw id, :func:`parse_subjects`); a path may be given as the archive member's name or
    relative to the class folders' root (``<class>/<file>``).

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when an image has no subject or the csv lists
            a path that is no image of the archive (counts only, never a name).
    """
    mapping = _parse_subjects_csv(csv_data)
    raw: list[str] = []
    missing = 0
    used: set[str] = set()
    for name in names:
        key = name if name in mapping else stripped[name]
        subject = mapping.get(key)
        if subject is None:
            missing += 1
            continue
        used.add(key)
        raw.append(subject)
    if missing:
        raise invalid(f"{missing} image(s) have no line in {SUBJECTS_CSV}; every image of a "
                      "subject dataset needs its subject")
    unknown = len(set(mapping) - used)
    if unknown:
        raise invalid(f"{SUBJECTS_CSV} lists {unknown} path(s) that are no image of the "
                      "archive")
    return parse_subjects(np.asarray(raw, dtype=str), len(names))
