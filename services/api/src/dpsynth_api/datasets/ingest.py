"""Turning an upload (image-folder zip/tar, .npz or Parquet) into the canonical arrays.

Canonical form (docs/architecture.md): ``images`` uint8 ``[N,H,W,C]`` (C = 1 or 3),
``labels`` int64 ``[N]`` (indices into ``class_names``), ``class_names`` unicode ``[K]``,
and optionally ``masks`` uint8 ``[N,H,W,1]``: one layout mask per image (DP-DocLDM layout
conditioning; only an ``.npz`` upload can carry them). The masks of a private dataset are
private data like its images: they share the dataset's budget and are read only inside a
DP job, with the images. For private uploads no error message names a record (docs/privacy.md):
only counts.

A ``subject`` dataset (privacy unit, see ``datasets/units.py``) also carries ``subjects``
int64 ``[N]``: each image's subject as a dense index 0..S-1. The raw ids come from the npz
array named by ``subject_column`` (default ``subjects``) or, for an image folder, from a
``subjects.csv`` (header ``path,subject``) at the archive root. Raw ids are remapped here
and appear in no error message (neither do file names). The only way they leave ingest is
``Ingested.subject_ids`` (in memory, never stored), from which the upload computes keyed
subject hashes (``datasets/overlap.py``) and drops them.
"""

from __future__ import annotations

import csv
import io
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.archives import ArchiveLimits, SafeArchive, describe, zip_entry_count
from dpsynth_api.datasets import limits as bounds
from dpsynth_api.datasets.images import decode_image
from dpsynth_api.inflation import Inflation, bomb

_IGNORED_PARTS = ("__MACOSX",)
NPZ_ARRAYS = ("images", "labels", "class_names", "masks")
"""The arrays an uploaded ``.npz`` may hold (and, for a subject upload, its subject-id
array); any other array is refused."""
SUBJECTS_CSV = "subjects.csv"
"""An image-folder archive's subject map at its root: header ``path,subject``."""


@dataclass(frozen=True)
class IngestLimits:
    archive: ArchiveLimits
    max_image_pixels: int
    max_classes: int = bounds.MAX_CLASSES  # the other bounds: datasets/limits.py
    min_image_side: int = bounds.MIN_IMAGE_SIDE
    max_aspect_ratio: float = bounds.MAX_ASPECT_RATIO
    min_private_records: int = bounds.MIN_PRIVATE_RECORDS


@dataclass
class Ingested:
    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    source_format: str
    masks: np.ndarray | None = None
    subjects: np.ndarray | None = None  # dense subject index per image (subject unit only)
    subject_ids: list[str] | None = field(default=None, repr=False)
    """The normalised raw id of each dense subject index (``subject_ids[s]`` is subject s):
    held in memory for the keyed subject hashes only; never written, logged or returned."""

    @property
    def size(self) -> int:
        return int(self.images.shape[0])

    @property
    def subject_count(self) -> int | None:
        """S, the true number of subjects (None: not a subject upload)."""
        if self.subjects is None:
            return None
        return int(self.subjects.max()) + 1 if self.subjects.size else 0

    @property
    def unit_count(self) -> int:
        """The true number of privacy units: subjects, or images."""
        count = self.subject_count
        return self.size if count is None else count

    @property
    def image_shape(self) -> list[int]:
        return [int(d) for d in self.images.shape[1:]]

    def class_counts(self) -> dict[str, int]:
        """The true number of UNITS per class: images, or (subject unit) the subjects with
        at least one image in the class."""
        if self.subjects is not None:
            counts = subjects_per_class(self.labels, self.subjects, len(self.class_names))
        else:
            counts = np.bincount(self.labels, minlength=len(self.class_names))
        return {name: int(c) for name, c in zip(self.class_names, counts, strict=True)}


def subjects_per_class(labels: np.ndarray, subjects: np.ndarray, num_classes: int) -> np.ndarray:
    """The number of distinct subjects with at least one image in each class ``[K]``."""
    if subjects.size == 0:
        return np.zeros(num_classes, dtype=np.int64)
    pairs = np.unique(np.stack([subjects.astype(np.int64), labels.astype(np.int64)]), axis=1)
    return np.bincount(pairs[1], minlength=num_classes).astype(np.int64)


def _invalid(detail: str) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_DATASET, detail)


def ingest_upload(path: Path, filename: str, *, private: bool, label_domain: list[str] | None,
                  limits: IngestLimits, subject_column: str | None = None) -> Ingested:
    """Validate an upload and convert it to canonical arrays.

    Args:
        path: the uploaded bytes on local disk.
        filename: the client's file name (``.npz`` selects the array format).
        private: whether the data is private (errors then never name records).
        label_domain: the declared class names (required for private data by the caller).
        limits: archive and image caps.
        subject_column: a subject upload (``units.subject_column_for``): the npz array of
            subject ids; an image folder carries ``subjects.csv`` instead. None: image unit.

    Raises:
        DpsynthError: 422 with ``invalid_archive``, ``unsafe_archive``, ``invalid_image``,
            ``unsafe_npz`` or ``invalid_dataset``.
    """
    if label_domain is not None:
        bounds.check_class_count(len(label_domain), limits.max_classes, "declared classes")
    data = _ingest(path, filename, private=private, label_domain=label_domain, limits=limits,
                   subject_column=subject_column)
    bounds.check_image_size(*data.images.shape[1:3], min_side=limits.min_image_side,
                            max_aspect=limits.max_aspect_ratio)
    bounds.check_record_count(data.unit_count, private=private,
                              minimum=limits.min_private_records,
                              what="images" if data.subjects is None else "subjects")
    return data


def _ingest(path: Path, filename: str, *, private: bool, label_domain: list[str] | None,
            limits: IngestLimits, subject_column: str | None) -> Ingested:
    if filename.lower().endswith(".npz"):
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits,
                         subject_column=subject_column)
    if filename.lower().endswith(".parquet") or _is_parquet(path):
        return _from_parquet(path, private=private, label_domain=label_domain, limits=limits,
                             subject_column=subject_column)
    archive = SafeArchive(path, limits.archive, private=private)
    if archive.kind == "zip" and archive.members and all(
            m.name.endswith(".npy") for m in archive.members):
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits,
                         subject_column=subject_column)
    return _from_image_folder(archive, label_domain=label_domain, limits=limits,
                              subjects=subject_column is not None)


def dense_subjects(raw: np.ndarray, n: int) -> np.ndarray:
    """Remap raw subject ids (integers or strings) to dense int64 indices 0..S-1.

    Errors give counts only, never an id.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` for a wrong shape or dtype, or empty ids.
    """
    return parse_subjects(raw, n)[0]


def parse_subjects(raw: np.ndarray, n: int) -> tuple[np.ndarray, list[str]]:
    """Dense subject indices ``[n]`` and each index's normalised raw id.

    The normalised id is the stripped string of a string id and ``str(int)`` of an integer
    id, so a subject uploaded once as ``7`` and once as ``"7"`` is the same subject. The ids
    are returned for the keyed subject hashes only (``Ingested.subject_ids``).

    Raises:
        DpsynthError: 422 ``invalid_dataset`` for a wrong shape or dtype, or empty ids.
    """
    if raw.ndim != 1 or raw.shape[0] != n:
        raise _invalid(f"the subject ids must be a 1-d array of length {n} (one per image)")
    if raw.dtype.kind in "US":
        text = np.char.strip(raw.astype(str))
        empty = int(np.count_nonzero(text == ""))
        if empty:
            raise _invalid(f"{empty} image(s) have an empty subject id; every image needs "
                           "its subject")
        raw = text
    elif raw.dtype.kind not in "iu":
        raise _invalid("the subject ids must be integers or strings")
    unique, inverse = np.unique(raw, return_inverse=True)
    if unique.dtype.kind in "iu":
        ids = [str(int(u)) for u in unique.tolist()]
    else:
        ids = [str(u) for u in unique.tolist()]
    return np.asarray(inverse, dtype=np.int64).reshape(n), ids


def _split_subjects_csv(files: list[str]) -> tuple[list[str], str | None]:
    """Take the root ``subjects.csv`` (or ``<top>/subjects.csv`` when every file sits in
    ``<top>/``) out of an archive's files; return (the other files, the csv's name)."""
    found = [f for f in files if f == SUBJECTS_CSV or (
        f.count("/") == 1 and f.endswith("/" + SUBJECTS_CSV))]
    if not found:
        return files, None
    if len(found) > 1:
        raise _invalid(f"the archive has more than one {SUBJECTS_CSV} at its root")
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
        raise _invalid(f"{SUBJECTS_CSV} is not UTF-8 text") from exc
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "path" not in reader.fieldnames or (
            column not in reader.fieldnames):
        raise _invalid(f"{SUBJECTS_CSV} needs a header with the columns 'path' and "
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
        raise _invalid(f"{SUBJECTS_CSV}: {empty} line(s) lack a path or a subject and "
                       f"{duplicates} path(s) are listed twice; give each image exactly one "
                       "subject")
    return mapping


def _strip_root(names: list[list[str]]) -> list[list[str]]:
    # "data/cat/1.png" -> "cat/1.png" when every file sits under one top folder.
    while names and all(len(p) >= 3 for p in names) and len({p[0] for p in names}) == 1:
        names = [p[1:] for p in names]
    return names


def _visible(name: str) -> bool:
    parts = name.split("/")
    return not any(p.startswith(".") or p in _IGNORED_PARTS for p in parts)


def _class_names(found: set[str], label_domain: list[str] | None, *, private: bool) -> list[str]:
    if label_domain is None:
        return sorted(found)
    outside = found - set(label_domain)
    if outside:
        named = "" if private else f": {sorted(outside)}"
        raise _invalid(f"{len(outside)} class(es) of the data are not in the declared "
                       f"label_domain{named}")
    return list(label_domain)


def _from_image_folder(archive: SafeArchive, *, label_domain: list[str] | None,
                       limits: IngestLimits, subjects: bool = False) -> Ingested:
    private = archive.private
    files = [m.name for m in archive.members if _visible(m.name)]
    csv_name = None
    if subjects:
        files, csv_name = _split_subjects_csv(files)
        if csv_name is None:
            raise _invalid(f"privacy_unit 'subject' needs a {SUBJECTS_CSV} (header "
                           "'path,subject') at the archive root, one line per image")
    if not files:
        raise _invalid("the archive contains no image files")
    parts = _strip_root([f.split("/") for f in files])
    if any(len(p) != 2 for p in parts):
        bad = sum(len(p) != 2 for p in parts)
        raise _invalid(f"{bad} file(s) are not inside exactly one class folder: expected "
                       "<class>/<image> (one sub-folder per class)")
    class_of = {f: p[0] for f, p in zip(files, parts, strict=True)}
    bounds.check_class_count(len(set(class_of.values())), limits.max_classes)
    class_names = _class_names(set(class_of.values()), label_domain, private=private)
    index = {name: i for i, name in enumerate(class_names)}
    arrays: list[np.ndarray] = []
    labels: list[int] = []
    names: list[str] = []
    csv_data: bytes | None = None
    decoded = _Decoded(limits)
    for name, data in archive.iter_files():
        if name == csv_name:
            csv_data = data
        if name not in class_of:
            continue
        arrays.append(decoded.add(_decode(data, limits, where=describe(name, private=private),
                                          private=private)))
        labels.append(index[class_of[name]])
        names.append(name)
    dense, subject_ids = None, None
    if csv_name is not None:
        stripped = {f: "/".join(p) for f, p in zip(files, parts, strict=True)}
        dense, subject_ids = _folder_subjects(csv_data or b"", names, stripped)
    return Ingested(_stack(arrays, private=private), np.asarray(labels, dtype=np.int64),
                    class_names, archive.kind, subjects=dense, subject_ids=subject_ids)


class _Decoded:
    """The running size of the decoded images of one upload: at most
    ``max_uncompressed_bytes`` (small PNGs of one colour decode to megabytes each)."""

    def __init__(self, limits: IngestLimits) -> None:
        self.cap, self.total = limits.archive.max_uncompressed_bytes, 0

    def add(self, image: np.ndarray) -> np.ndarray:
        self.total += image.nbytes
        if self.total > self.cap:
            raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the images decode to more than "
                               f"{self.cap} bytes (decompression bomb?)", limit=self.cap)
        return image


def _decode(data: bytes, limits: IngestLimits, *, where: str, private: bool) -> np.ndarray:
    """One image, refused at once when too small or too narrow (datasets/limits.py)."""
    image = decode_image(data, max_pixels=limits.max_image_pixels, where=where)
    bounds.check_image_size(*image.shape[:2], min_side=limits.min_image_side,
                            max_aspect=limits.max_aspect_ratio, private=private)
    return image


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
        raise _invalid(f"{missing} image(s) have no line in {SUBJECTS_CSV}; every image of a "
                       "subject dataset needs its subject")
    unknown = len(set(mapping) - used)
    if unknown:
        raise _invalid(f"{SUBJECTS_CSV} lists {unknown} path(s) that are no image of the "
                       "archive")
    return parse_subjects(np.asarray(raw, dtype=str), len(names))


def _stack(arrays: list[np.ndarray], *, private: bool) -> np.ndarray:
    colour = any(a.ndim == 3 for a in arrays)
    if private and colour and any(a.ndim == 2 for a in arrays):
        # The published image_shape would otherwise turn RGB because of ONE colour record
        # (issue 13: nothing published may depend on a single private record).
        raise _invalid("the images mix grayscale and colour; a private dataset's colour "
                       "mode is published with its image shape and must not depend on one "
                       "record: convert every image to one mode before uploading")
    if colour:  # grayscale images join a colour (public) dataset as RGB
        arrays = [a if a.ndim == 3 else np.repeat(a[:, :, None], 3, axis=2) for a in arrays]
    else:
        arrays = [a[:, :, None] for a in arrays]
    shapes = Counter(a.shape for a in arrays)
    if len(shapes) > 1:
        listed = "" if private else ": " + ", ".join(
            f"{s[1]}x{s[0]} ({n})" for s, n in shapes.most_common(5))
        raise _invalid(f"the images have {len(shapes)} different sizes{listed}; "
                       "all images of a dataset must have one size")
    return np.stack(arrays).astype(np.uint8)


def _check_npz_container(path: Path, limits: IngestLimits) -> None:
    """The npz's entry count, declared sizes (against the upload's allowance: an absolute
    cap and a compression ratio, dpsynth_api/inflation.py) and array headers, before any
    array is read; ``np.load`` then reads each array into one buffer of its checked size."""
    if (zip_entry_count(path) or 0) > limits.archive.max_members:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the .npz has more than "
                           f"{limits.archive.max_members} entries",
                           limit=limits.archive.max_members)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the .npz file is corrupt") from exc
    meter = Inflation(limits.archive, path.stat().st_size)
    if sum(i.file_size for i in infos) > meter.cap:
        raise bomb(limits.archive, meter.compressed_bytes, what="the .npz")
    bounds.check_npy_headers(path, meter.cap)  # a header claiming terabytes: refused unallocated


def _load_npz_arrays(path: Path, subject_column: str | None = None) -> dict[str, np.ndarray]:
    allowed = (*NPZ_ARRAYS, subject_column) if subject_column is not None else NPZ_ARRAYS
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"images", "labels"} - set(npz.files)
            if missing:
                raise _invalid(f"the .npz lacks the array(s) {sorted(missing)}")
            if subject_column is not None and subject_column not in npz.files:
                raise _invalid(f"privacy_unit 'subject': the .npz lacks the subject-id array "
                               f"{subject_column!r} (set subject_column to its name)")
            other = sorted(set(npz.files) - set(allowed))
            if other:
                hint = (" (subject ids: declare privacy_unit 'subject')"
                        if subject_column is None and "subjects" in other else "")
                raise _invalid(f"the .npz holds {len(other)} array(s) other than "
                               f"{', '.join(allowed)}: {other[:5]}{hint}")
            return {name: npz[name] for name in npz.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise DpsynthError(ErrorCode.UNSAFE_NPZ, "the .npz contains pickled (object) "
                               "arrays, which are never loaded; save plain arrays") from exc
        raise _invalid("the .npz arrays could not be read") from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the .npz file is corrupt") from exc


def _npz_images(images: np.ndarray, limits: IngestLimits) -> np.ndarray:
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or images.shape[0] == 0:
        raise _invalid("'images' must be a non-empty uint8 array [N,H,W] or [N,H,W,C]")
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[3] not in (1, 3):
        raise _invalid(f"'images' must have 1 or 3 channels, not {images.shape[3]}")
    if images.shape[1] * images.shape[2] > limits.max_image_pixels:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, "the images exceed the pixel limit")
    return np.ascontiguousarray(images)


def _npz_masks(masks: np.ndarray, images: np.ndarray, limits: IngestLimits) -> np.ndarray:
    """One uint8 layout mask per image, of its image's size: ``[N,H,W,1]``."""
    if masks.dtype != np.uint8 or masks.ndim not in (3, 4):
        raise _invalid("'masks' must be a uint8 array [N,H,W] or [N,H,W,1]")
    if masks.ndim == 3:
        masks = masks[..., None]
    if masks.shape[3] != 1:
        raise _invalid(f"'masks' must have 1 channel, not {masks.shape[3]}")
    if masks.shape[1] * masks.shape[2] > limits.max_image_pixels:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, "the masks exceed the pixel limit")
    n, height, width = images.shape[:3]
    if masks.shape[0] != n:
        raise _invalid(f"'masks' must hold one mask per image: {masks.shape[0]} masks for "
                       f"{n} images")
    if masks.shape[1:3] != (height, width):
        raise _invalid(f"each mask must have its image's size {width}x{height}, not "
                       f"{masks.shape[2]}x{masks.shape[1]}")
    return np.ascontiguousarray(masks)


def _npz_class_names(names: np.ndarray) -> list[str]:
    if names.ndim != 1 or names.dtype.kind != "U" or names.shape[0] == 0:
        raise _invalid("'class_names' must be a non-empty array of strings [K]")
    listed = [str(c) for c in names.tolist()]
    if len(set(listed)) != len(listed):
        raise _invalid("'class_names' has duplicate names")
    return listed


def _named_labels(labels: np.ndarray, names: list[str]) -> np.ndarray:
    """Integer labels that index the file's ``class_names``, as those names."""
    if labels.dtype.kind in "US":
        return labels
    if labels.dtype.kind not in "iu" or labels.ndim != 1:
        return labels  # refused with the usual message by _npz_labels
    outside = int(np.count_nonzero((labels < 0) | (labels >= len(names))))
    if outside:
        raise _invalid(f"{outside} label(s) do not index the file's {len(names)} class_names")
    return np.asarray(names, dtype=str)[labels.astype(np.int64)]


def _npz_labels(labels: np.ndarray, n: int, label_domain: list[str] | None, *,
                private: bool, max_classes: int = bounds.MAX_CLASSES,
                ) -> tuple[np.ndarray, list[str]]:
    if labels.ndim != 1 or labels.shape[0] != n:
        raise _invalid(f"'labels' must be a 1-d array of length {n} (one per image)")
    if labels.dtype.kind in "US":
        names = labels.astype(str)
        if label_domain is None:
            bounds.check_class_count(len(np.unique(names)), max_classes)
        class_names = _class_names(set(names.tolist()), label_domain, private=private)
        index = {c: i for i, c in enumerate(class_names)}
        return np.asarray([index[s] for s in names.tolist()], dtype=np.int64), class_names
    if labels.dtype.kind not in "iu":
        raise _invalid("'labels' must be integers (indices into label_domain) or strings")
    ints = labels.astype(np.int64)
    if label_domain is None:  # before range(k) builds one name per class
        bounds.check_int_labels(ints, max_classes)
    k = len(label_domain) if label_domain is not None else int(ints.max()) + 1
    outside = int(np.count_nonzero((ints < 0) | (ints >= k)))
    if outside:
        raise _invalid(f"{outside} label(s) are outside the label domain of {k} classes")
    class_names = list(label_domain) if label_domain is not None else [str(i) for i in range(k)]
    return ints, class_names


def _from_npz(path: Path, *, private: bool, label_domain: list[str] | None,
              limits: IngestLimits, subject_column: str | None = None) -> Ingested:
    if subject_column is not None and subject_column in NPZ_ARRAYS:
        raise _invalid(f"subject_column must name an array other than {', '.join(NPZ_ARRAYS)}")
    _check_npz_container(path, limits)
    arrays = _load_npz_arrays(path, subject_column)
    images = _npz_images(arrays["images"], limits)
    masks = _npz_masks(arrays["masks"], images, limits) if "masks" in arrays else None
    labels = arrays["labels"]
    if "class_names" in arrays:  # the canonical form: integer labels name these classes
        bounds.check_class_count(int(arrays["class_names"].shape[0]) if arrays[
            "class_names"].ndim else 0, limits.max_classes)
        names = _npz_class_names(arrays["class_names"])
        labels = _named_labels(labels, names)
        label_domain = names if label_domain is None else label_domain
    ints, class_names = _npz_labels(labels, images.shape[0], label_domain, private=private,
                                    max_classes=limits.max_classes)
    subjects, subject_ids = (parse_subjects(arrays[subject_column], images.shape[0])
                             if subject_column is not None else (None, None))
    return Ingested(images, ints, class_names, "npz", masks, subjects=subjects,
                    subject_ids=subject_ids)


PARQUET_IMAGE, PARQUET_LABEL = "image", "label"
"""The columns of a Parquet upload: ``image`` (encoded image bytes, or a struct with a
``bytes`` field as Hugging Face ``datasets`` writes it) and ``label`` (integer index into
the label domain, or class name); a subject upload adds its ``subject_column``."""


def _is_parquet(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"PAR1"


def _from_parquet(path: Path, *, private: bool, label_domain: list[str] | None,
                  limits: IngestLimits, subject_column: str | None = None) -> Ingested:
    """A Parquet table of encoded images, labels and (subject unit) subject ids.

    The footer is checked before any data page is read: at most ``max_members`` rows and
    at most the upload's allowance (inflation.py) of uncompressed column data (a
    decompression bomb is refused unread). Images are decoded like an image folder's;
    errors name a row only for public uploads.

    Raises:
        DpsynthError: 422 ``invalid_archive`` (not Parquet), ``unsafe_archive`` (caps),
            ``invalid_image`` or ``invalid_dataset``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        footer = parquet.metadata
        names = list(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the Parquet file is corrupt") from exc
    if footer.num_rows > limits.archive.max_members:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the Parquet file has more than "
                           f"{limits.archive.max_members} rows", limit=limits.archive.max_members)
    meter = Inflation(limits.archive, path.stat().st_size)
    if sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups)) > meter.cap:
        raise bomb(limits.archive, meter.compressed_bytes, what="the Parquet file")
    missing = sorted({PARQUET_IMAGE, PARQUET_LABEL} - set(names))
    if missing:
        raise _invalid(f"the Parquet file lacks the column(s) {missing}")
    if subject_column is not None and subject_column not in names:
        raise _invalid(f"privacy_unit 'subject': the Parquet file lacks the subject-id column "
                       f"{subject_column!r} (set subject_column to its name)")
    if subject_column is None and "subjects" in names:
        raise _invalid("the Parquet file has a 'subjects' column (subject ids: declare "
                       "privacy_unit 'subject')")
    columns = [PARQUET_IMAGE, PARQUET_LABEL, *([subject_column] if subject_column else [])]
    try:
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the Parquet file is corrupt") from exc
    n = table.num_rows
    if n == 0:
        raise _invalid("the Parquet file has no rows")
    decoded = _Decoded(limits)
    images = [decoded.add(_decode(data, limits, where="a row" if private else f"row {i}",
                                  private=private))
              for i, data in enumerate(_parquet_image_bytes(table.column(PARQUET_IMAGE)))]
    labels = _parquet_values(table.column(PARQUET_LABEL), "label")
    ints, class_names = _npz_labels(labels, n, label_domain, private=private,
                                    max_classes=limits.max_classes)
    subjects, subject_ids = None, None
    if subject_column is not None:
        subjects, subject_ids = parse_subjects(
            _parquet_values(table.column(subject_column), "subject id"), n)
    return Ingested(_stack(images, private=private), ints, class_names, "parquet",
                    subjects=subjects, subject_ids=subject_ids)


def _parquet_image_bytes(column: Any) -> list[bytes]:
    """The encoded bytes of each row's image (binary, or a struct's ``bytes`` field)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        column = pa.chunked_array([chunk.field("bytes") for chunk in column.chunks],
                                  type=kind.field("bytes").type)
        kind = column.type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise _invalid("the Parquet column 'image' must hold encoded image bytes (binary, "
                       "or a struct with a 'bytes' field)")
    if column.null_count:
        raise _invalid(f"{column.null_count} row(s) have no image")
    return [bytes(v) for v in column.to_pylist()]


def _parquet_values(column: Any, what: str) -> np.ndarray:
    """An integer or string column as a numpy array; nulls refused by count."""
    import pyarrow as pa

    if column.null_count:
        raise _invalid(f"{column.null_count} row(s) have no {what}")
    kind = column.type
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy(), dtype=np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(column.to_pylist(), dtype=str)
    raise _invalid(f"the Parquet {what} column must hold integers or strings")


def write_canonical(data: Ingested, dest: Path) -> Path:
    """Write the canonical ``.npz`` (loadable with ``allow_pickle=False``), with the
    dataset's layout masks when it has them and its dense ``subjects`` (subject unit)."""
    arrays = {"images": data.images, "labels": data.labels,
              "class_names": np.asarray(data.class_names, dtype=str)}
    if data.masks is not None:
        arrays["masks"] = data.masks
    if data.subjects is not None:  # dense indices only: the raw ids never leave ingest
        arrays["subjects"] = data.subjects.astype(np.int64)
    with dest.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    return dest
