"""PUBLIC synthetic document-like images with their line-level layout masks.

Every pixel is drawn from a seeded generator: no record of anyone is involved, so these
images and masks are public data. They serve as public pretraining data for the layout
conditioning of DP-DocLDM (``PretrainSpec.layout_conditioning``), as a public source of
layouts at generation time (``GenerateSpec.layout_source``) and in tests.

Ten classes, each with its own line-level skeleton (letterhead + address block +
paragraphs; form boxes and fields; invoice header + item table + totals; memo header lines;
e-mail header fields + body; resume sections with bullets; report title + two columns;
table grid; newspaper columns; slides), with jitter in margins, line heights, counts and
lengths so that classes overlap somewhat like real documents.

A mask is 255 exactly on the bounding box of each rendered text line and 0 elsewhere:
every pixel darker than :data:`TEXT_THRESHOLD` is text ink inside its line's box, and each
box is tight (its border rows and columns carry ink). Rules, boxes, shading and pictures
are graphics, lighter than the threshold and not in the mask.

Example::

    images, masks, labels, names = generate_documents(100, size=64, seed=0)
    write_npz("documents.npz", 100, size=64, seed=0)   # canonical dataset file
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpsynth_shared.documents.layouts import LAYOUTS
from dpsynth_shared.documents.page import TEXT_THRESHOLD, Document, Page

CLASS_NAMES: tuple[str, ...] = tuple(LAYOUTS)
"""The document classes, in label order when ``classes`` is not given."""

MIN_SIZE, MAX_SIZE = 16, 256

__all__ = ["CLASS_NAMES", "MAX_SIZE", "MIN_SIZE", "TEXT_THRESHOLD", "Document",
           "generate_documents", "render_document", "save_npz", "write_npz"]


def render_document(class_name: str, *, size: int = 64,
                    rng: np.random.Generator) -> Document:
    """Render one page of ``class_name`` with its layout mask and line boxes.

    Args:
        class_name: one of :data:`CLASS_NAMES`.
        size: the square page's side in pixels (16..256).
        rng: the generator every random choice is drawn from.

    Raises:
        ValueError: for an unknown class or a size outside 16..256.
    """
    if class_name not in LAYOUTS:
        raise ValueError(f"unknown document class {class_name!r}; known: {list(CLASS_NAMES)}")
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be in {MIN_SIZE}..{MAX_SIZE}, not {size}")
    page = Page(size, rng)
    LAYOUTS[class_name](page)
    return page.render()


def _classes(classes: Sequence[str] | None) -> list[str]:
    names = list(CLASS_NAMES if classes is None else classes)
    if not names:
        raise ValueError("classes must name at least one document class")
    if len(set(names)) != len(names):
        raise ValueError("classes has duplicates")
    unknown = [c for c in names if c not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown document classes {unknown}; known: {list(CLASS_NAMES)}")
    return names


def generate_documents(n_per_class: int, *, size: int = 64, seed: int = 0,
                       classes: Sequence[str] | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Generate ``n_per_class`` pages of each class, with their layout masks.

    Page ``i`` of class ``c`` is drawn from ``default_rng([seed, index of c in
    CLASS_NAMES, i])``: the same seed gives the same pages, whatever subset of classes or
    number of pages is asked for.

    Args:
        n_per_class: pages per class (at least 1).
        size: the square side in pixels (16..256).
        seed: the generator seed (a non-negative integer).
        classes: a subset of :data:`CLASS_NAMES` (default: all), in label order.

    Returns:
        ``(images, masks, labels, class_names)``: images and masks uint8 ``[N, S, S, 1]``
        (masks 255 on text-line boxes, 0 elsewhere), labels int64 ``[N]`` indexing
        ``class_names``; grouped by class, ``N = n_per_class * len(class_names)``.

    Raises:
        ValueError: for ``n_per_class < 1``, a negative seed, a bad size or bad classes.
    """
    if n_per_class < 1:
        raise ValueError("n_per_class must be at least 1")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    names = _classes(classes)
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be in {MIN_SIZE}..{MAX_SIZE}, not {size}")
    n = n_per_class * len(names)
    images = np.empty((n, size, size, 1), dtype=np.uint8)
    masks = np.empty((n, size, size, 1), dtype=np.uint8)
    for label, name in enumerate(names):
        index = CLASS_NAMES.index(name)
        for i in range(n_per_class):
            doc = render_document(name, size=size,
                                  rng=np.random.default_rng([seed, index, i]))
            images[label * n_per_class + i, :, :, 0] = doc.image
            masks[label * n_per_class + i, :, :, 0] = doc.mask
    labels = np.repeat(np.arange(len(names), dtype=np.int64), n_per_class)
    return images, masks, labels, names


def save_npz(path: str | Path, images: np.ndarray, masks: np.ndarray, labels: np.ndarray,
             class_names: Sequence[str]) -> Path:
    """Write arrays as a canonical dataset file (``images``, ``labels``, ``class_names``,
    ``masks``), loadable with ``allow_pickle=False`` and accepted by ``POST /v1/datasets``.
    """
    path = Path(path)
    with path.open("wb") as fh:
        np.savez_compressed(fh, images=images, labels=labels.astype(np.int64),
                            class_names=np.asarray(list(class_names), dtype=str), masks=masks)
    return path


def write_npz(path: str | Path, n_per_class: int, *, size: int = 64, seed: int = 0,
              classes: Sequence[str] | None = None) -> Path:
    """Generate the documents (:func:`generate_documents`) and write the canonical file.

    Returns:
        ``path``.
    """
    images, masks, labels, names = generate_documents(n_per_class, size=size, seed=seed,
                                                      classes=classes)
    return save_npz(path, images, masks, labels, names)
