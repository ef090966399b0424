"""Reading a synthetic corpus zip (a generate job's output) back into labelled images.

Layout written by :func:`dpsynth_ml.sample` and the generate runner: ``<class dir>/<i>.png``
(class directories are file-system-safe spellings of the model's class names) and a root
``manifest.json``. The zip is checked from its headers before anything is inflated, like
uploads are (``dpsynth_api.archives``): member names (no absolute paths, no ``..``), member
count, declared sizes (decompression bombs) and what may sit where. Nothing is extracted
to disk; each member is read bounded by its declared size and decoded in memory.

A corpus is synthetic (DP output or a public model's samples), so errors may name members.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from PIL import Image

MANIFEST = "manifest.json"
MAX_MEMBERS = 500_000
MAX_UNCOMPRESSED_BYTES = 4 << 30
MAX_MEMBER_BYTES = 16 << 20
MAX_RATIO = 200  # deflated PNGs barely compress; a bomb compresses by thousands
MAX_PIXELS = 1024 * 1024


@dataclass(frozen=True)
class Corpus:
    """The corpus's images, labels indexing the reference's class names, and its manifest."""

    images: np.ndarray
    labels: np.ndarray
    manifest: dict[str, Any]


def class_dirs(class_names: Sequence[str]) -> list[str]:
    """The folder of each class name, spelled as the sampler spells them
    (``dpsynth_ml.sampling.generate``): unsafe characters become ``_``, duplicates get
    ``_<index>``."""
    names: list[str] = []
    for idx, name in enumerate(class_names):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or f"class_{idx}"
        names.append(safe if safe not in names else f"{safe}_{idx}")
    return names


def _bad(detail: str) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_SPEC, f"the corpus archive is unusable: {detail}")


def _safe_name(raw: str) -> str:
    name = raw.replace("\\", "/")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"corpus member {raw!r} escapes the "
                           "archive")
    return "/".join(parts)


def _scan(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    infos = [i for i in zf.infolist() if not i.is_dir()]
    if len(infos) > MAX_MEMBERS:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"the corpus has more than {MAX_MEMBERS} "
                           "members")
    total = 0
    for info in infos:
        _safe_name(info.filename)
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"corpus member {info.filename!r} is "
                               "a symbolic link")
        if info.file_size > MAX_MEMBER_BYTES or (
                info.compress_size and info.file_size / info.compress_size > MAX_RATIO):
            raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"corpus member {info.filename!r} "
                               "inflates beyond the limits")
        total += info.file_size
    if total > MAX_UNCOMPRESSED_BYTES:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, "the corpus inflates beyond "
                           f"{MAX_UNCOMPRESSED_BYTES} bytes")
    return infos


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    with zf.open(info) as fh:
        data = fh.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise DpsynthError(ErrorCode.UNSAFE_ARCHIVE, f"corpus member {info.filename!r} is not "
                           "the size its header declares")
    return data


def _decode(data: bytes, name: str) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG":
                raise _bad(f"{name!r} is not a PNG")
            if image.width * image.height > MAX_PIXELS:
                raise _bad(f"{name!r} has more than {MAX_PIXELS} pixels")
            mode = "L" if image.mode in ("1", "L", "LA", "I", "I;16") else "RGB"
            array = np.asarray(image.convert(mode), dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _bad(f"{name!r} cannot be decoded as an image") from exc
    return array[..., None] if array.ndim == 2 else array


def read_corpus(path: Path, class_names: Sequence[str]) -> Corpus:
    """Load a corpus zip with labels indexing ``class_names`` (the reference's domain).

    Raises:
        DpsynthError: ``unsafe_archive`` (paths, links, sizes), ``invalid_spec`` for a
            corpus that is not a generate job's layout, has classes the reference dataset
            lacks, or images of different shapes.
    """
    folders = {d: i for i, d in enumerate(class_dirs(class_names))}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = _scan(zf)
            by_name = {_safe_name(i.filename): i for i in infos}
            if MANIFEST not in by_name:
                raise _bad("it has no manifest.json")
            manifest = json.loads(_read(zf, by_name.pop(MANIFEST)))
            if not isinstance(manifest, dict):
                raise _bad("manifest.json is not an object")
            unknown = sorted(set(map(str, manifest.get("counts") or {})) - set(class_names))
            if unknown:
                raise DpsynthError(ErrorCode.INVALID_SPEC, f"the corpus has classes the "
                                   f"reference dataset does not know: {unknown[:10]}",
                                   unknown_classes=unknown[:50])
            images, labels = [], []
            for name in sorted(by_name, key=_order):
                parts = name.split("/")
                if len(parts) != 2 or not parts[1].endswith(".png"):
                    raise _bad(f"unexpected member {name!r} (expected <class>/<i>.png)")
                if parts[0] not in folders:
                    raise DpsynthError(ErrorCode.INVALID_SPEC, f"the corpus folder "
                                       f"{parts[0]!r} is not a class of the reference dataset")
                images.append(_decode(_read(zf, by_name[name]), name))
                labels.append(folders[parts[0]])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, json.JSONDecodeError,
            UnicodeDecodeError, NotImplementedError) as exc:
        raise _bad(f"not a readable zip ({type(exc).__name__})") from exc
    if not images:
        raise _bad("it holds no image")
    shapes = {a.shape for a in images}
    if len(shapes) != 1:
        raise _bad(f"its images have different shapes {sorted(shapes)[:4]}")
    return Corpus(images=np.stack(images), labels=np.asarray(labels, dtype=np.int64),
                  manifest=manifest)


def _order(name: str) -> tuple[str, int, str]:
    """Class folder, then the image index numerically (``10.png`` after ``9.png``)."""
    folder, _, file = name.partition("/")
    stem = file.rsplit(".", 1)[0]
    return folder, int(stem) if stem.isdigit() else -1, file

