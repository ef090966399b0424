"""Upper and lower bounds on what an upload may be (issue 14, items 4, 5 and 16).

Each is checked at ingest and refused with 422 (docs/architecture.md, "Uploads"):

* the declared shape of every array of an ``.npz`` (its ``.npy`` header) is read before the
  array is: ``prod(shape) * itemsize`` must fit in the member's uncompressed size and in the
  archive limit, so a header claiming terabytes is refused unallocated (``unsafe_npz``);
* labels: at most ``max_classes`` classes. Without a declared ``label_domain`` (public
  uploads), integer labels must lie in ``[0, max_classes)`` and string labels (or folder
  names, or an npz's ``class_names``) count at most ``max_classes`` distinct values; a
  declared domain holds at most ``max_classes`` names. Checked before any per-class
  structure is built (``invalid_dataset``);
* images: each side at least ``min_image_side`` pixels and the longer side at most
  ``max_aspect_ratio`` times the shorter (``invalid_dataset``);
* a private dataset holds at least ``min_private_records`` units (images, or subjects).

No message names a record: the image size is one for the whole dataset (and published
with it), counts are the uploader's own.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

MAX_CLASSES = 10_000
"""The most classes a dataset may have (and the integer labels' bound without a domain)."""
MIN_IMAGE_SIDE = 8
"""The shortest image side, in pixels."""
MAX_ASPECT_RATIO = 16.0
"""The longest side over the shortest side, at most (16:1)."""
MIN_PRIVATE_RECORDS = 2
"""The fewest privacy units (images, or subjects) of a private dataset."""


def _invalid(detail: str) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_DATASET, detail)


def check_npy_headers(path: Path, max_bytes: int) -> None:
    """Read the ``.npy`` header of every member of the npz at ``path`` and refuse a declared
    shape whose data would not fit in the member or exceeds ``max_bytes``.

    Raises:
        DpsynthError: 422 ``unsafe_npz`` (a header larger than its member or the limit),
            ``invalid_dataset`` (a garbled header), ``invalid_archive`` (a corrupt file).
    """
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue  # np.load ignores it; the array list is checked on load
                with zf.open(info) as fh:
                    shape, itemsize, offset = _npy_header(fh)
                declared = math.prod(shape) * itemsize
                if declared > max_bytes or declared > info.file_size - offset:
                    raise DpsynthError(
                        ErrorCode.UNSAFE_NPZ, f"an array of the .npz declares a shape of "
                        f"{declared} bytes, more than its {max(0, info.file_size - offset)} "
                        f"bytes of data (limit {max_bytes}): refused before loading",
                        limit=max_bytes)
    except ValueError as exc:  # a garbled header: as np.load would have answered
        raise _invalid("the .npz arrays could not be read") from exc
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the .npz file is corrupt") from exc


def _npy_header(fh: object) -> tuple[tuple[int, ...], int, int]:
    """(shape, itemsize, data offset) from an open ``.npy`` stream; ValueError if bad."""
    fmt = np.lib.format
    version = fmt.read_magic(fh)  # type: ignore[arg-type]
    if version == (1, 0):
        shape, _, dtype = fmt.read_array_header_1_0(fh)  # type: ignore[arg-type]
    elif version == (2, 0):
        shape, _, dtype = fmt.read_array_header_2_0(fh)  # type: ignore[arg-type]
    else:  # 3.0: utf-8 field names; same layout as 2.0
        shape, _, dtype = fmt._read_array_header(fh, version)  # type: ignore[attr-defined]
    offset = int(fh.tell())  # type: ignore[attr-defined]
    if any(int(d) < 0 for d in shape):
        raise ValueError("negative dimension")
    # an object dtype has itemsize 8 here; np.load refuses it (no pickles) anyway
    return tuple(int(d) for d in shape), int(dtype.itemsize), offset


def check_class_count(count: int, max_classes: int, what: str = "classes") -> None:
    """Refuse more than ``max_classes`` classes (422 ``invalid_dataset``)."""
    if count > max_classes:
        raise _invalid(f"the dataset has {count} {what}, more than the limit of {max_classes} "
                       "classes")


def check_int_labels(ints: np.ndarray, max_classes: int) -> None:
    """Integer labels without a declared domain: each in ``[0, max_classes)``."""
    if ints.size == 0:
        return
    outside = int(np.count_nonzero((ints < 0) | (ints >= max_classes)))
    if outside:
        raise _invalid(f"{outside} label(s) are outside [0, {max_classes}): without a "
                       f"label_domain, integer labels index at most {max_classes} classes "
                       "(declare a label_domain, or number the classes from 0)")


def check_image_size(height: int, width: int, *, min_side: int, max_aspect: float,
                     private: bool = False) -> None:
    """Each side at least ``min_side`` and an aspect ratio of at most ``max_aspect``:1.

    ``private``: one decoded record is checked, so its size is not named."""
    what = "an image" if private else f"the images are {width}x{height} pixels;"
    if min(height, width) < min_side:
        raise _invalid(f"{what} each side must be at least {min_side} pixels"
                       if not private else f"{what} has a side under {min_side} pixels")
    if max(height, width) > max_aspect * min(height, width):
        raise _invalid(f"{what} the longer side may be at most {max_aspect:g} times the "
                       "shorter" if not private else f"{what} has a longer side more than "
                       f"{max_aspect:g} times the shorter")


def check_record_count(units: int, *, private: bool, minimum: int, what: str) -> None:
    """A private dataset holds at least ``minimum`` units."""
    if private and units < minimum:
        raise _invalid(f"a private dataset needs at least {minimum} {what}; the upload has "
                       f"{units}")
