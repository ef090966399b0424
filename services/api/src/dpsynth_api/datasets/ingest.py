"""Turning an upload (image-folder zip/tar, or .npz) into the canonical dataset arrays.

Canonical form (docs/architecture.md): ``images`` uint8 ``[N,H,W,C]`` (C = 1 or 3),
``labels`` int64 ``[N]`` (indices into ``class_names``), ``class_names`` unicode ``[K]``,
and optionally ``masks`` uint8 ``[N,H,W,1]``: one layout mask per image (DP-DocLDM layout
conditioning; only an ``.npz`` upload can carry them). The masks of a private dataset are
private data like its images: they share the dataset's budget and are read only inside a
DP job, with the images. For private uploads no error message names a record (DESIGN §3):
only counts.
"""

from __future__ import annotations

import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.archives import ArchiveLimits, SafeArchive, describe
from dpsynth_api.datasets.images import decode_image

_IGNORED_PARTS = ("__MACOSX",)
NPZ_ARRAYS = ("images", "labels", "class_names", "masks")
"""The arrays an uploaded ``.npz`` may hold; any other array is refused."""


@dataclass(frozen=True)
class IngestLimits:
    archive: ArchiveLimits
    max_image_pixels: int


@dataclass
class Ingested:
    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    source_format: str
    masks: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.images.shape[0])

    @property
    def image_shape(self) -> list[int]:
        return [int(d) for d in self.images.shape[1:]]

    def class_counts(self) -> dict[str, int]:
        counts = np.bincount(self.labels, minlength=len(self.class_names))
        return {name: int(c) for name, c in zip(self.class_names, counts, strict=True)}


def _invalid(detail: str) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_DATASET, detail)


def ingest_upload(path: Path, filename: str, *, private: bool, label_domain: list[str] | None,
                  limits: IngestLimits) -> Ingested:
    """Validate an upload and convert it to canonical arrays.

    Args:
        path: the uploaded bytes on local disk.
        filename: the client's file name (``.npz`` selects the array format).
        private: whether the data is private (errors then never name records).
        label_domain: the declared class names (required for private data by the caller).
        limits: archive and image caps.

    Raises:
        DpsynthError: 422 with ``invalid_archive``, ``unsafe_archive``, ``invalid_image``,
            ``unsafe_npz`` or ``invalid_dataset``.
    """
    if filename.lower().endswith(".npz"):
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits)
    archive = SafeArchive(path, limits.archive, private=private)
    if archive.kind == "zip" and archive.members and all(
            m.name.endswith(".npy") for m in archive.members):
        return _from_npz(path, private=private, label_domain=label_domain, limits=limits)
    return _from_image_folder(archive, label_domain=label_domain, limits=limits)


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
                       limits: IngestLimits) -> Ingested:
    private = archive.private
    files = [m.name for m in archive.members if _visible(m.name)]
    if not files:
        raise _invalid("the archive contains no image files")
    parts = _strip_root([f.split("/") for f in files])
    if any(len(p) != 2 for p in parts):
        bad = sum(len(p) != 2 for p in parts)
        raise _invalid(f"{bad} file(s) are not inside exactly one class folder: expected "
                       "<class>/<image> (one sub-folder per class)")
    class_of = {f: p[0] for f, p in zip(files, parts, strict=True)}
    class_names = _class_names(set(class_of.values()), label_domain, private=private)
    index = {name: i for i, name in enumerate(class_names)}
    arrays: list[np.ndarray] = []
    labels: list[int] = []
    for name, data in archive.iter_files():
        if name not in class_of:
            continue
        where = describe(name, private=private)
        arrays.append(decode_image(data, max_pixels=limits.max_image_pixels, where=where))
        labels.append(index[class_of[name]])
    return Ingested(_stack(arrays, private=private), np.asarray(labels, dtype=np.int64),
                    class_names, archive.kind)


def _stack(arrays: list[np.ndarray], *, private: bool) -> np.ndarray:
    colour = any(a.ndim == 3 for a in arrays)
    if colour:  # grayscale images join a colour dataset as RGB
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
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DpsynthError(ErrorCode.INVALID_ARCHIVE, "the .npz file is corrupt") from exc
    cap = limits.archive.max_uncompressed_bytes
    if sum(i.file_size for i in infos) > cap:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the .npz inflates past the limit of {cap} "
                           "bytes (decompression bomb?)", limit=cap)


def _load_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"images", "labels"} - set(npz.files)
            if missing:
                raise _invalid(f"the .npz lacks the array(s) {sorted(missing)}")
            other = sorted(set(npz.files) - set(NPZ_ARRAYS))
            if other:
                raise _invalid(f"the .npz holds {len(other)} array(s) other than "
                               f"{', '.join(NPZ_ARRAYS)}: {other[:5]}")
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
                private: bool) -> tuple[np.ndarray, list[str]]:
    if labels.ndim != 1 or labels.shape[0] != n:
        raise _invalid(f"'labels' must be a 1-d array of length {n} (one per image)")
    if labels.dtype.kind in "US":
        names = labels.astype(str)
        class_names = _class_names(set(names.tolist()), label_domain, private=private)
        index = {c: i for i, c in enumerate(class_names)}
        return np.asarray([index[s] for s in names.tolist()], dtype=np.int64), class_names
    if labels.dtype.kind not in "iu":
        raise _invalid("'labels' must be integers (indices into label_domain) or strings")
    ints = labels.astype(np.int64)
    k = len(label_domain) if label_domain is not None else int(ints.max()) + 1
    outside = int(np.count_nonzero((ints < 0) | (ints >= k)))
    if outside:
        raise _invalid(f"{outside} label(s) are outside the label domain of {k} classes")
    class_names = list(label_domain) if label_domain is not None else [str(i) for i in range(k)]
    return ints, class_names


def _from_npz(path: Path, *, private: bool, label_domain: list[str] | None,
              limits: IngestLimits) -> Ingested:
    _check_npz_container(path, limits)
    arrays = _load_npz_arrays(path)
    images = _npz_images(arrays["images"], limits)
    masks = _npz_masks(arrays["masks"], images, limits) if "masks" in arrays else None
    labels = arrays["labels"]
    if "class_names" in arrays:  # the canonical form: integer labels name these classes
        names = _npz_class_names(arrays["class_names"])
        labels = _named_labels(labels, names)
        label_domain = names if label_domain is None else label_domain
    ints, class_names = _npz_labels(labels, images.shape[0], label_domain, private=private)
    return Ingested(images, ints, class_names, "npz", masks)


def write_canonical(data: Ingested, dest: Path) -> Path:
    """Write the canonical ``.npz`` (loadable with ``allow_pickle=False``), with the
    dataset's layout masks when it has them."""
    arrays = {"images": data.images, "labels": data.labels,
              "class_names": np.asarray(data.class_names, dtype=str)}
    if data.masks is not None:
        arrays["masks"] = data.masks
    with dest.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    return dest
