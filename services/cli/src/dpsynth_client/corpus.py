"""A synthetic corpus zip as arrays: ``images`` (uint8 N×H×W×C), ``labels`` (int64 N).

The layout a generate job writes (``dpsynth_ml.sampling.generate.sample`` and the worker's generate
runner): one folder per class, ``<class folder>/<i>.png``, and a root ``manifest.json``
(provenance, privacy figures, sampling, ``counts`` per class name). Class folders are
file-system-safe spellings of the class names: characters outside ``[A-Za-z0-9._-]``
become ``_``, and a spelling already taken gets ``_<class index>``.

Labels index ``class_names``: the names given (e.g. the model's or the dataset's class
list, as :meth:`dpsynth_client.Client.download_corpus` passes), else the manifest's class
names in sorted order. Images are ordered by label, then by their number in the folder.
Grayscale images keep one channel (C = 1), others are converted to RGB (C = 3).
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and Pillow are imported on first use: `import dpsynth_client` stays light
    import numpy as np
    import numpy.typing as npt

MANIFEST = "manifest.json"


class CorpusError(ValueError):
    """The file is not a corpus zip a generate job wrote (its message says why)."""


@dataclass(frozen=True)
class Corpus:
    """A synthetic corpus, ready for training: ``images[i]`` has class
    ``class_names[labels[i]]``; ``manifest`` is the corpus's ``manifest.json``
    (``job_epsilon``, ``dataset_epsilon_spent``, ``delta``, ``model_id``, ``counts``...)."""

    images: npt.NDArray[np.uint8]
    labels: npt.NDArray[np.int64]
    class_names: list[str]
    manifest: dict[str, Any]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def class_folders(class_names: Sequence[str]) -> list[str]:
    """The folder of each class name, spelled as the sampler spells them."""
    folders: list[str] = []
    for index, name in enumerate(class_names):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or f"class_{index}"
        folders.append(safe if safe not in folders else f"{safe}_{index}")
    return folders


def read_manifest(path: Path | str) -> dict[str, Any]:
    """The ``manifest.json`` of a corpus zip.

    Raises:
        CorpusError: not a zip, or no manifest object at its root.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            manifest = json.loads(zf.read(MANIFEST))
    except KeyError as exc:
        raise CorpusError(f"{path} has no {MANIFEST}: not a dpsynth corpus") from exc
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CorpusError(f"{path} is not a readable corpus zip ({exc})") from exc
    if not isinstance(manifest, dict):
        raise CorpusError(f"{path}: {MANIFEST} is not an object")
    return manifest


def read_corpus(path: Path | str, class_names: Sequence[str] | None = None) -> Corpus:
    """Load a corpus zip (e.g. what ``dpsynth download`` saved) into arrays.

    Args:
        path: the corpus zip.
        class_names: the class list labels index (default: the manifest's class names,
            sorted); it must name every class the corpus holds.

    Raises:
        CorpusError: not a corpus zip, a member outside ``<class>/<i>.png``, a folder of no
            class in ``class_names``, an undecodable image, or images of different shapes.
    """
    import numpy as np

    manifest = read_manifest(path)
    names = list(class_names) if class_names is not None else sorted(
        str(name) for name in (manifest.get("counts") or {}))
    label_of = {folder: label for label, folder in enumerate(class_folders(names))}
    members: list[tuple[int, int, str]] = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir() or info.filename == MANIFEST:
                continue
            folder, _, file = info.filename.partition("/")
            stem = file[:-4] if file.endswith(".png") else ""
            if not stem or "/" in file:
                raise CorpusError(f"unexpected member {info.filename!r} (a corpus holds "
                                  "<class>/<i>.png and manifest.json)")
            if folder not in label_of:
                raise CorpusError(f"the corpus folder {folder!r} is no class of {names}"
                                  + ("" if class_names is not None else
                                     " (the manifest's counts): pass class_names"))
            members.append((label_of[folder], int(stem) if stem.isdigit() else -1,
                            info.filename))
        members.sort()
        images = [_decode(zf.read(name), name) for _, _, name in members]
    if not images:
        raise CorpusError(f"{path} holds no image")
    shapes = sorted({image.shape for image in images})
    if len(shapes) != 1:
        raise CorpusError(f"the corpus's images have different shapes: {shapes[:4]}")
    return Corpus(images=np.stack(images),
                  labels=np.asarray([label for label, _, _ in members], dtype=np.int64),
                  class_names=names, manifest=manifest)


def _decode(data: bytes, name: str) -> npt.NDArray[np.uint8]:
    import numpy as np
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            mode = "L" if image.mode in ("1", "L", "LA", "I", "I;16") else "RGB"
            array = np.asarray(image.convert(mode), dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{name!r} cannot be decoded as an image") from exc
    return array[..., None] if array.ndim == 2 else array
