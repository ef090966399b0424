"""The canonical records of an upload and the checks every upload format shares.

Canonical form (docs/architecture.md): ``images`` uint8 ``[N,H,W,C]`` (C = 1 or 3),
``labels`` int64 ``[N]`` (indices into ``class_names``), ``class_names`` unicode ``[K]``,
optionally ``masks`` uint8 ``[N,H,W,1]`` and, for a subject dataset, ``subjects`` int64 ``[N]``.
The format readers (``ingest``: npz; ``folders``: image-folder archives; ``parquet_upload``)
all end here: images decoded under the pixel and decoded-size caps, stacked to one size,
labels checked against the declared label domain.

What an error may say (docs/privacy.md, docs/datasets.md): for a private upload no message
names a record (a file name, a row, a subject id, a label value found in the data), only
counts. Label values outside the declared ``label_domain`` are named (the first few,
sorted, and how many) for a PUBLIC upload; a private upload's refusal gives their count and
says how to see them: the CLI names them on the user's own machine before uploading
(``dpsynth_cli.uploads.check_labels``), so a private class folder named after a patient
never travels back in a response that proxies and client error trackers may keep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import limits as bounds
from dpsynth_api.datasets.images import decode_image

SHOWN_UNKNOWN_LABELS = 5
"""How many label values outside the label domain a refusal names (sorted)."""
_MAX_SHOWN_LABEL_CHARS = 40


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
    held: np.ndarray | None = field(default=None, repr=False)
    """Each image's side in a split the OWNER declared (``[N]`` bool, True: in the upload's
    ``holdout_from`` folder, e.g. ``test/``); None without one. Read by the held-out split
    (``datasets/holdout.py``); never written with the canonical arrays."""

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


def invalid(detail: str, **extensions: object) -> DpsynthError:
    """A 422 ``invalid_dataset``."""
    return DpsynthError(ErrorCode.INVALID_DATASET, detail, **extensions)


def _shown(value: str) -> str:
    text = value if len(value) <= _MAX_SHOWN_LABEL_CHARS else value[:_MAX_SHOWN_LABEL_CHARS] + "…"
    return repr(text)  # quotes, and control characters escaped (terminals)


PRIVATE_LABELS_HINT = ("the values are not named for a private upload (they are its data); "
                       "`dpsynth datasets upload` names them on your machine before "
                       "uploading a folder or a zip")


def unknown_labels(found: Iterable[str], label_domain: list[str], *,
                   private: bool) -> DpsynthError:
    """The refusal of label values outside the declared label domain: how many, and, for a
    public upload, the first :data:`SHOWN_UNKNOWN_LABELS` of them, sorted."""
    outside = sorted(set(found) - set(label_domain))
    what = (f"{len(outside)} label value(s) of the upload are not in the declared "
            "label_domain")
    fix = "add them to the label domain, or leave their images out of the upload"
    if private:
        return invalid(f"{what}; {fix} ({PRIVATE_LABELS_HINT})",
                       unknown_label_count=len(outside))
    shown = outside[:SHOWN_UNKNOWN_LABELS]
    more = f" and {len(outside) - len(shown)} more" if len(outside) > len(shown) else ""
    return invalid(f"{what}: {', '.join(_shown(v) for v in shown)}{more}; {fix}",
                   unknown_labels=shown, unknown_label_count=len(outside))


def class_names_for(found: set[str], label_domain: list[str] | None, *,
                    private: bool) -> list[str]:
    """The dataset's class names: the declared domain (every found label must be in it),
    or, without one, the found labels sorted."""
    if label_domain is None:
        return sorted(found)
    if not found <= set(label_domain):
        raise unknown_labels(found, label_domain, private=private)
    return list(label_domain)


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
        raise invalid(f"the subject ids must be a 1-d array of length {n} (one per image)")
    if raw.dtype.kind in "US":
        text = np.char.strip(raw.astype(str))
        empty = int(np.count_nonzero(text == ""))
        if empty:
            raise invalid(f"{empty} image(s) have an empty subject id; every image needs "
                          "its subject")
        raw = text
    elif raw.dtype.kind not in "iu":
        raise invalid("the subject ids must be integers or strings")
    unique, inverse = np.unique(raw, return_inverse=True)
    if unique.dtype.kind in "iu":
        ids = [str(int(u)) for u in unique.tolist()]
    else:
        ids = [str(u) for u in unique.tolist()]
    return np.asarray(inverse, dtype=np.int64).reshape(n), ids


class DecodedSize:
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


def decode_checked(data: bytes, limits: IngestLimits, *, where: str,
                   private: bool) -> np.ndarray:
    """One image, refused at once when too small or too narrow (datasets/limits.py)."""
    image = decode_image(data, max_pixels=limits.max_image_pixels, where=where)
    bounds.check_image_size(*image.shape[:2], min_side=limits.min_image_side,
                            max_aspect=limits.max_aspect_ratio, private=private)
    return image


def stack_images(arrays: list[np.ndarray], *, private: bool) -> np.ndarray:
    """The decoded images as one uint8 ``[N,H,W,C]`` array (one size, one colour mode)."""
    colour = any(a.ndim == 3 for a in arrays)
    if private and colour and any(a.ndim == 2 for a in arrays):
        # The published image_shape would otherwise turn RGB because of ONE colour record
        # (issue 13: nothing published may depend on a single private record).
        raise invalid("the images mix grayscale and colour; a private dataset's colour "
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
        raise invalid(f"the images have {len(shapes)} different sizes{listed}; "
                      "all images of a dataset must have one size")
    return np.stack(arrays).astype(np.uint8)


def label_indices(labels: np.ndarray, n: int, label_domain: list[str] | None, *,
                  private: bool, max_classes: int = bounds.MAX_CLASSES,
                  ) -> tuple[np.ndarray, list[str]]:
    """Array labels (npz, Parquet) as indices into the class names, and the class names.

    String labels are class names (checked against the domain); integer labels index the
    domain (or, without one, ``0..max``). Values outside the domain are named for a public
    upload only.

    Raises:
        DpsynthError: 422 ``invalid_dataset``.
    """
    if labels.ndim != 1 or labels.shape[0] != n:
        raise invalid(f"'labels' must be a 1-d array of length {n} (one per image)")
    if labels.dtype.kind in "US":
        names = labels.astype(str)
        if label_domain is None:
            bounds.check_class_count(len(np.unique(names)), max_classes)
        class_names = class_names_for(set(names.tolist()), label_domain, private=private)
        index = {c: i for i, c in enumerate(class_names)}
        return np.asarray([index[s] for s in names.tolist()], dtype=np.int64), class_names
    if labels.dtype.kind not in "iu":
        raise invalid("'labels' must be integers (indices into label_domain) or strings")
    ints = labels.astype(np.int64)
    if label_domain is None:  # before range(k) builds one name per class
        bounds.check_int_labels(ints, max_classes)
    k = len(label_domain) if label_domain is not None else int(ints.max()) + 1
    bad = (ints < 0) | (ints >= k)
    outside = int(np.count_nonzero(bad))
    if outside:
        values = np.unique(ints[bad])
        what = (f"{outside} label(s) are outside the label domain of {k} classes (indices "
                f"0..{k - 1} of label_domain)")
        if private:
            raise invalid(f"{what}; {PRIVATE_LABELS_HINT.split(';')[0]}",
                          unknown_label_count=int(values.size))
        shown = [int(v) for v in values[:SHOWN_UNKNOWN_LABELS]]
        more = f" and {values.size - len(shown)} more" if values.size > len(shown) else ""
        raise invalid(f"{what}: the value(s) {', '.join(map(str, shown))}{more}",
                      unknown_labels=shown, unknown_label_count=int(values.size))
    class_names = list(label_domain) if label_domain is not None else [str(i) for i in range(k)]
    return ints, class_names
