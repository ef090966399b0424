"""Turning an upload into the canonical arrays: which reader reads it, and ``.npz`` uploads.

Canonical form (docs/architecture.md, ``datasets/ingested.py``): ``images`` uint8
``[N,H,W,C]`` (C = 1 or 3), ``labels`` int64 ``[N]`` (indices into ``class_names``),
``class_names`` unicode ``[K]``, and optionally ``masks`` uint8 ``[N,H,W,1]``: one layout mask
per image (DP-DocLDM layout conditioning; only an ``.npz`` upload can carry them). The masks
of a private dataset are private data like its images: they share the dataset's budget and
are read only inside a DP job, with the images. For private uploads no error message names a
record (docs/privacy.md): only counts.

The accepted formats are :data:`dpsynth_shared.upload_formats.UPLOAD_FORMATS` (docs/datasets.md):
an ``.npz`` (here), a Parquet table (``datasets/parquet_upload.py``) and image-folder
archives, zip or tar, in three layouts (``datasets/folders.py``: class folders, Hugging Face
split folders, ``metadata.csv`` / ``metadata.jsonl`` label files). The content decides the
format (a zip is a zip whatever its name); a file that is none of them is refused with the
sentence naming every accepted format.

A ``subject`` dataset (privacy unit, see ``datasets/units.py``) also carries ``subjects``
int64 ``[N]``: each image's subject as a dense index 0..S-1. The raw ids come from the npz
array named by ``subject_column`` (default ``subjects``) or, for an image folder, from a
``subjects.csv`` (header ``path,subject``) at the archive root. Raw ids are remapped here
and appear in no error message (neither do file names). The only way they leave ingest is
``Ingested.subject_ids`` (in memory, never stored), from which the upload computes keyed
subject hashes (``datasets/overlap.py``) and drops them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.upload_formats import format_of, unsupported_format

from dpsynth_api.archives import SafeArchive, detect_kind, zip_entry_count
from dpsynth_api.datasets import limits as bounds
from dpsynth_api.datasets.folders import SUBJECTS_CSV, LayoutOptions, read_image_folder
from dpsynth_api.datasets.ingested import (
    Ingested,
    IngestLimits,
    dense_subjects,
    invalid,
    label_indices,
    parse_subjects,
    subjects_per_class,
)
from dpsynth_api.datasets.parquet_upload import is_parquet, read_parquet
from dpsynth_api.inflation import Inflation, bomb

__all__ = ["NPZ_ARRAYS", "SUBJECTS_CSV", "IngestLimits", "Ingested", "LayoutOptions",
           "dense_subjects", "ingest_upload", "parse_subjects", "subjects_per_class",
           "write_canonical"]

NPZ_ARRAYS = ("images", "labels", "class_names", "masks")
"""The arrays an uploaded ``.npz`` may hold (and, for a subject upload, its subject-id
array); any other array is refused."""


def ingest_upload(path: Path, filename: str, *, private: bool, label_domain: list[str] | None,
                  limits: IngestLimits, subject_column: str | None = None,
                  layout: LayoutOptions | None = None) -> Ingested:
    """Validate an upload and convert it to canonical arrays.

    Args:
        path: the uploaded bytes on local disk.
        filename: the client's file name (``.npz`` selects the array format).
        private: whether the data is private (errors then never name records).
        label_domain: the declared class names (required for private data by the caller).
        limits: archive and image caps.
        subject_column: a subject upload (``units.subject_column_for``): the npz array of
            subject ids; an image folder carries ``subjects.csv`` instead. None: image unit.
        layout: the image-folder options (``holdout_from``, ``label_column``); refused for
            an npz or Parquet upload.

    Raises:
        DpsynthError: 422 with ``invalid_archive`` (also: not an accepted format, naming
            them all), ``unsafe_archive``, ``invalid_image``, ``unsafe_npz`` or
            ``invalid_dataset``.
    """
    if label_domain is not None:
        bounds.check_class_count(len(label_domain), limits.max_classes, "declared classes")
    data = _ingest(path, filename, private=private, label_domain=label_domain, limits=limits,
                   subject_column=subject_column, layout=layout or LayoutOptions())
    bounds.check_image_size(*data.images.shape[1:3], min_side=limits.min_image_side,
                            max_aspect=limits.max_aspect_ratio)
    bounds.check_record_count(data.unit_count, private=private,
                              minimum=limits.min_private_records,
                              what="images" if data.subjects is None else "subjects")
    return data


def _folder_options_only(layout: LayoutOptions, what: str) -> None:
    """``holdout_from`` and ``label_column`` read image-folder archives only."""
    given = [name for name, value in (
        ("holdout_from", layout.holdout_from), ("label_column", layout.label_column))
        if value is not None]
    if given:
        raise invalid(f"{' and '.join(given)} apply to image-folder archives (split folders, "
                      f"metadata.csv / metadata.jsonl), not to {what}")


def _ingest(path: Path, filename: str, *, private: bool, label_domain: list[str] | None,
            limits: IngestLimits, subject_column: str | None,
            layout: LayoutOptions) -> Ingested:
    suffix_format = format_of(filename)
    if filename.lower().endswith(".npz"):
        _folder_options_only(layout, "an .npz file")
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits,
                         subject_column=subject_column)
    if filename.lower().endswith(".parquet") or is_parquet(path):
        _folder_options_only(layout, "a Parquet file")
        return read_parquet(path, private=private, label_domain=label_domain, limits=limits,
                            subject_column=subject_column)
    try:
        detect_kind(path, limits.archive)
    except DpsynthError as exc:
        if exc.code != ErrorCode.INVALID_ARCHIVE:
            raise
        # neither zip, tar, npz nor Parquet: say what is accepted
        raise unsupported_format(filename, readable_suffix=suffix_format is not None) from exc
    archive = SafeArchive(path, limits.archive, private=private)
    if archive.kind == "zip" and archive.members and all(
            m.name.endswith(".npy") for m in archive.members):
        _folder_options_only(layout, "an .npz file")
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits,
                         subject_column=subject_column)
    return read_image_folder(archive, label_domain=label_domain, limits=limits,
                             subjects=subject_column is not None, options=layout)


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
                raise invalid(f"the .npz lacks the array(s) {sorted(missing)}")
            if subject_column is not None and subject_column not in npz.files:
                raise invalid(f"privacy_unit 'subject': the .npz lacks the subject-id array "
                               f"{subject_column!r} (set subject_column to its name)")
            other = sorted(set(npz.files) - set(allowed))
            if other:
                hint = (" (subject ids: declare privacy_unit 'subject')"
                        if subject_column is None and "subjects" in other else "")
                raise invalid(f"the .npz holds {len(other)} array(s) other than "
                               f"{', '.join(allowed)}: {other[:5]}{hint}")
            return {name: npz[name] for name in npz.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise DpsynthError(ErrorCode.UNSAFE_NPZ, "the .npz contains pickled (object) "
                               "arrays, which are never loaded; save plain arrays") from exc
        raise invalid("the .npz arrays could not be read") from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the .npz file is corrupt") from exc


def _npz_images(images: np.ndarray, limits: IngestLimits) -> np.ndarray:
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or images.shape[0] == 0:
        raise invalid("'images' must be a non-empty uint8 array [N,H,W] or [N,H,W,C]")
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[3] not in (1, 3):
        raise invalid(f"'images' must have 1 or 3 channels, not {images.shape[3]}")
    if images.shape[1] * images.shape[2] > limits.max_image_pixels:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, "the images exceed the pixel limit")
    return np.ascontiguousarray(images)


def _npz_masks(masks: np.ndarray, images: np.ndarray, limits: IngestLimits) -> np.ndarray:
    """One uint8 layout mask per image, of its image's size: ``[N,H,W,1]``."""
    if masks.dtype != np.uint8 or masks.ndim not in (3, 4):
        raise invalid("'masks' must be a uint8 array [N,H,W] or [N,H,W,1]")
    if masks.ndim == 3:
        masks = masks[..., None]
    if masks.shape[3] != 1:
        raise invalid(f"'masks' must have 1 channel, not {masks.shape[3]}")
    if masks.shape[1] * masks.shape[2] > limits.max_image_pixels:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, "the masks exceed the pixel limit")
    n, height, width = images.shape[:3]
    if masks.shape[0] != n:
        raise invalid(f"'masks' must hold one mask per image: {masks.shape[0]} masks for "
                       f"{n} images")
    if masks.shape[1:3] != (height, width):
        raise invalid(f"each mask must have its image's size {width}x{height}, not "
                       f"{masks.shape[2]}x{masks.shape[1]}")
    return np.ascontiguousarray(masks)


def _npz_class_names(names: np.ndarray) -> list[str]:
    if names.ndim != 1 or names.dtype.kind != "U" or names.shape[0] == 0:
        raise invalid("'class_names' must be a non-empty array of strings [K]")
    listed = [str(c) for c in names.tolist()]
    if len(set(listed)) != len(listed):
        raise invalid("'class_names' has duplicate names")
    return listed


def _named_labels(labels: np.ndarray, names: list[str]) -> np.ndarray:
    """Integer labels that index the file's ``class_names``, as those names."""
    if labels.dtype.kind in "US":
        return labels
    if labels.dtype.kind not in "iu" or labels.ndim != 1:
        return labels  # refused with the usual message by label_indices
    outside = int(np.count_nonzero((labels < 0) | (labels >= len(names))))
    if outside:
        raise invalid(f"{outside} label(s) do not index the file's {len(names)} class_names")
    return np.asarray(names, dtype=str)[labels.astype(np.int64)]



def _from_npz(path: Path, *, private: bool, label_domain: list[str] | None,
              limits: IngestLimits, subject_column: str | None = None) -> Ingested:
    if subject_column is not None and subject_column in NPZ_ARRAYS:
        raise invalid(f"subject_column must name an array other than {', '.join(NPZ_ARRAYS)}")
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
    ints, class_names = label_indices(labels, images.shape[0], label_domain, private=private,
                                    max_classes=limits.max_classes)
    subjects, subject_ids = (parse_subjects(arrays[subject_column], images.shape[0])
                             if subject_column is not None else (None, None))
    return Ingested(images, ints, class_names, "npz", masks, subjects=subjects,
                    subject_ids=subject_ids)



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
