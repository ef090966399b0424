"""Layout masks in uploaded ``.npz`` files: validated like images, kept in the canonical file;
the file's ``class_names`` name integer labels; any other array is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, ingest_upload, write_canonical
from dpsynth_shared.documents import generate_documents, save_npz
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=64 * 64)


def _ingest(tmp_path: Path, data: bytes, *, private: bool = False,
            domain: list[str] | None = None) -> Ingested:
    path = tmp_path / "upload"
    path.write_bytes(data)
    return ingest_upload(path, "d.npz", private=private, label_domain=domain, limits=LIMITS)


def _error(tmp_path: Path, data: bytes, **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        _ingest(tmp_path, data, **kw)  # type: ignore[arg-type]
    return info.value


def _arrays(n: int = 6, size: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"images": rng.integers(0, 255, (n, size, size, 1), dtype=np.uint8),
            "labels": np.arange(n) % 2,
            "masks": np.where(rng.random((n, size, size)) < 0.3, 255, 0).astype(np.uint8)}


def test_masks_are_kept_as_n_h_w_1_and_written_to_the_canonical_file(tmp_path: Path) -> None:
    arrays = _arrays()
    data = _ingest(tmp_path, b.npz_bytes(**arrays), private=True, domain=["a", "b"])
    assert data.masks is not None and data.masks.shape == (6, 8, 8, 1)
    np.testing.assert_array_equal(data.masks[..., 0], arrays["masks"])
    out = write_canonical(data, tmp_path / "canonical.npz")
    with np.load(out, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["class_names", "images", "labels", "masks"]
        np.testing.assert_array_equal(npz["masks"], data.masks)
    plain = _ingest(tmp_path, b.npz_bytes(images=arrays["images"], labels=arrays["labels"]))
    assert plain.masks is None
    with np.load(write_canonical(plain, tmp_path / "plain.npz"), allow_pickle=False) as npz:
        assert "masks" not in npz.files


def test_the_document_generator_file_uploads_with_its_names_and_masks(tmp_path: Path) -> None:
    images, masks, labels, names = generate_documents(2, size=32, seed=0,
                                                      classes=["memo", "table", "letter"])
    path = save_npz(tmp_path / "docs.npz", images, masks, labels, names)
    data = _ingest(tmp_path, path.read_bytes())
    assert data.class_names == ["memo", "table", "letter"]
    assert data.class_counts() == {"memo": 2, "table": 2, "letter": 2}
    np.testing.assert_array_equal(data.labels, labels)
    assert data.masks is not None
    np.testing.assert_array_equal(data.masks, masks)
    # a declared label domain may order the file's classes differently
    ordered = _ingest(tmp_path, path.read_bytes(), domain=["letter", "memo", "table"])
    assert ordered.labels.tolist() == [1, 1, 2, 2, 0, 0]


@pytest.mark.parametrize(("masks", "words"), [
    (np.zeros((6, 8, 8), np.float32), "uint8"),
    (np.zeros((6, 8, 8, 3), np.uint8), "1 channel"),
    (np.zeros((5, 8, 8), np.uint8), "one mask per image"),
    (np.zeros((6, 8, 4), np.uint8), "its image's size"),
    (np.zeros((6,), np.uint8), "uint8 array"),
])
def test_bad_masks_are_refused(tmp_path: Path, masks: np.ndarray, words: str) -> None:
    arrays = {**_arrays(), "masks": masks}
    err = _error(tmp_path, b.npz_bytes(**arrays))
    assert err.code == ErrorCode.INVALID_DATASET and words in err.detail, err.detail


def test_masks_over_the_pixel_limit_are_unsafe(tmp_path: Path) -> None:
    big = np.zeros((2, 65, 65), np.uint8)
    arrays = {"images": np.zeros((2, 8, 8), np.uint8), "labels": np.arange(2), "masks": big}
    assert _error(tmp_path, b.npz_bytes(**arrays)).code == ErrorCode.UNSAFE_ARCHIVE


def test_any_other_array_is_refused(tmp_path: Path) -> None:
    arrays = {**_arrays(), "boxes": np.zeros((6, 4), np.int64)}
    err = _error(tmp_path, b.npz_bytes(**arrays), private=True, domain=["a", "b"])
    assert err.code == ErrorCode.INVALID_DATASET and "boxes" in err.detail


def test_class_names_of_the_file_are_checked(tmp_path: Path) -> None:
    arrays = _arrays()
    dup = _error(tmp_path, b.npz_bytes(**arrays, class_names=np.asarray(["a", "a"])))
    assert "duplicate" in dup.detail
    short = _error(tmp_path, b.npz_bytes(**arrays, class_names=np.asarray(["a"])))
    assert "do not index" in short.detail
    outside = _error(tmp_path, b.npz_bytes(**arrays, class_names=np.asarray(["a", "b"])),
                     private=True, domain=["a", "c"])
    assert outside.code == ErrorCode.INVALID_DATASET and "'b'" not in outside.detail
