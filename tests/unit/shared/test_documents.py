"""The public document generator: deterministic, ≥ 8 distinguishable classes, and masks that
cover exactly the rendered text lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dpsynth_shared.documents import (
    CLASS_NAMES,
    TEXT_THRESHOLD,
    generate_documents,
    render_document,
    write_npz,
)


def test_at_least_eight_named_classes() -> None:
    assert len(CLASS_NAMES) >= 8 and len(set(CLASS_NAMES)) == len(CLASS_NAMES)
    for name in ("letter", "form", "invoice", "memo", "email", "resume", "report", "table"):
        assert name in CLASS_NAMES


@pytest.mark.parametrize("size", [16, 64, 256])
def test_shapes_and_dtypes(size: int) -> None:
    images, masks, labels, names = generate_documents(2, size=size, seed=3)
    n = 2 * len(CLASS_NAMES)
    assert images.shape == masks.shape == (n, size, size, 1)
    assert images.dtype == masks.dtype == np.uint8 and labels.dtype == np.int64
    assert names == list(CLASS_NAMES)
    assert labels.tolist() == [k for k in range(len(names)) for _ in range(2)]
    assert set(np.unique(masks).tolist()) <= {0, 255}
    assert (masks.reshape(n, -1).max(axis=1) == 255).all()  # every page has text lines


def test_deterministic_by_seed_and_independent_of_the_subset() -> None:
    a = generate_documents(3, size=32, seed=7)
    b = generate_documents(3, size=32, seed=7)
    for x, y in zip(a[:3], b[:3], strict=True):
        np.testing.assert_array_equal(x, y)
    other = generate_documents(3, size=32, seed=8)
    assert not np.array_equal(a[0], other[0])
    subset = generate_documents(2, size=32, seed=7, classes=["table", "memo"])
    assert subset[3] == ["table", "memo"] and subset[2].tolist() == [0, 0, 1, 1]
    table, memo = CLASS_NAMES.index("table"), CLASS_NAMES.index("memo")
    np.testing.assert_array_equal(subset[0][:2], a[0][3 * table:3 * table + 2])
    np.testing.assert_array_equal(subset[1][2:], a[1][3 * memo:3 * memo + 2])


@pytest.mark.parametrize("size", [16, 24, 64, 131, 256])
def test_masks_are_exactly_the_text_line_boxes(size: int) -> None:
    for k, name in enumerate(CLASS_NAMES):
        for i in range(3 if size <= 64 else 1):
            doc = render_document(name, size=size, rng=np.random.default_rng([size, k, i]))
            assert doc.boxes, (name, i)
            union = np.zeros((size, size), dtype=bool)
            dark = doc.image < TEXT_THRESHOLD
            for y0, x0, y1, x1 in doc.boxes:
                assert 0 <= y0 < y1 <= size and 0 <= x0 < x1 <= size
                union[y0:y1, x0:x1] = True
                ink = dark[y0:y1, x0:x1]
                # tight: ink on every border row and column of the line's box
                assert ink[0].any() and ink[-1].any() and ink[:, 0].any() and ink[:, -1].any()
            np.testing.assert_array_equal(doc.mask, np.where(union, 255, 0))
            # every dark (text) pixel lies inside the mask
            assert not (dark & ~union).any(), (name, i)


def test_masks_of_the_batch_match_the_rendered_pages() -> None:
    images, masks, _, _ = generate_documents(2, size=48, seed=5, classes=["resume"])
    for i in range(2):
        k = CLASS_NAMES.index("resume")
        doc = render_document("resume", size=48, rng=np.random.default_rng([5, k, i]))
        np.testing.assert_array_equal(images[i, :, :, 0], doc.image)
        np.testing.assert_array_equal(masks[i, :, :, 0], doc.mask)


def _centroid_accuracy(x: np.ndarray, labels: np.ndarray, per_class: int, train: int) -> float:
    index = np.arange(len(x)) % per_class
    fit, held = index < train, index >= train
    centroids = np.stack([x[fit & (labels == c)].mean(axis=0) for c in np.unique(labels)])
    distances = ((x[held][:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    return float((distances.argmin(axis=1) == labels[held]).mean())


def test_classes_are_distinguishable_by_a_nearest_centroid_classifier() -> None:
    per_class = 50
    images, masks, labels, names = generate_documents(per_class, size=32, seed=11)
    chance = 1 / len(names)
    pooled = images[..., 0].reshape(len(images), 16, 2, 16, 2).mean(axis=(2, 4)) / 255
    accuracy = _centroid_accuracy(pooled.reshape(len(images), -1), labels, per_class, 30)
    assert accuracy > 0.6 > 5 * chance, accuracy
    layout = masks[..., 0].reshape(len(masks), 16, 2, 16, 2).mean(axis=(2, 4)) / 255
    assert _centroid_accuracy(layout.reshape(len(masks), -1), labels, per_class, 30) > 0.5


def test_classes_overlap_somewhat() -> None:
    # Jitter: pages of one class differ from each other (no class is a single template).
    images, _, labels, _ = generate_documents(6, size=32, seed=2)
    for c in np.unique(labels):
        pages = images[labels == c].reshape(6, -1)
        assert len({p.tobytes() for p in pages}) == 6


def test_write_npz_is_a_canonical_dataset_file(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "docs.npz", 2, size=32, seed=1, classes=["letter", "form"])
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["class_names", "images", "labels", "masks"]
        assert npz["images"].shape == npz["masks"].shape == (4, 32, 32, 1)
        assert npz["masks"].dtype == np.uint8 and npz["labels"].dtype == np.int64
        assert npz["class_names"].dtype.kind == "U"
        assert npz["class_names"].tolist() == ["letter", "form"]


@pytest.mark.parametrize("kwargs", [{"size": 8}, {"size": 300}, {"classes": []},
                                    {"classes": ["letter", "letter"]},
                                    {"classes": ["poem"]}, {"seed": -1}])
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        generate_documents(1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        generate_documents(0)
