"""Upload bounds without a database (issue 14, items 4, 5 and 16): npy headers claiming
huge shapes, label values that would create a million classes, images too small or too
narrow, private datasets of one record. Each is a 422 naming no record."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import limits
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, ingest_upload
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=1024 * 1024)
TIB = 1 << 40


def _ingest(tmp_path: Path, data: bytes, name: str = "u.npz", *, private: bool = False,
            domain: list[str] | None = None, lim: IngestLimits = LIMITS,
            subject_column: str | None = None) -> Ingested:
    path = tmp_path / "upload"
    path.write_bytes(data)
    return ingest_upload(path, name, private=private, label_domain=domain, limits=lim,
                         subject_column=subject_column)


def _error(tmp_path: Path, data: bytes, name: str = "u.npz", **kw: Any) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        _ingest(tmp_path, data, name, **kw)
    assert info.value.status == 422
    return info.value


def _images(n: int, height: int = 8, width: int = 8) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, size=(n, height, width), dtype=np.uint8)


def _npy_header_only(shape: tuple[int, ...], dtype: str = "<u1") -> bytes:
    """An ``.npy`` member whose header declares ``shape`` and that holds no data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _npz_members(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


# ---- item 4: an npy header claiming 9 TiB ----------------------------------------------

@pytest.mark.parametrize("shape", [(9 * TIB,), (3 * TIB, 3, 1), (9 * TIB // 64, 8, 8)])
def test_an_npy_header_claiming_terabytes_is_refused_before_loading(
        tmp_path: Path, shape: tuple[int, ...]) -> None:
    data = _npz_members({"images.npy": _npy_header_only(shape),
                         "labels.npy": _npy(np.zeros(2, dtype=np.int64))})
    assert len(data) < 2048
    started = time.monotonic()
    err = _error(tmp_path, data)
    assert err.code == ErrorCode.UNSAFE_NPZ and "refused before loading" in err.detail
    assert time.monotonic() - started < 5


def test_a_header_larger_than_its_member_is_refused_even_under_the_limit(
        tmp_path: Path) -> None:
    # 1 MiB declared (under the 5 MiB cap), 0 bytes of data: refused unread
    data = _npz_members({"images.npy": _npy_header_only((16384, 8, 8)),
                         "labels.npy": _npy(np.zeros(16384, dtype=np.int64))})
    assert _error(tmp_path, data).code == ErrorCode.UNSAFE_NPZ
    # an image folder zip of .npy members goes the same way
    assert _error(tmp_path, data, "u.zip").code == ErrorCode.UNSAFE_NPZ


def test_a_garbled_npy_header_is_still_a_422(tmp_path: Path) -> None:
    data = _npz_members({"images.npy": b"\x93NUMPY\x01\x00\xff\xffnot a header",
                         "labels.npy": _npy(np.zeros(2, dtype=np.int64))})
    assert _error(tmp_path, data).code == ErrorCode.INVALID_DATASET


def test_honest_headers_still_load(tmp_path: Path) -> None:
    data = _ingest(tmp_path, b.npz_bytes(images=_images(4), labels=np.array([0, 1, 0, 1]),
                                         masks=np.zeros((4, 8, 8), np.uint8)))
    assert data.size == 4 and data.masks is not None


# ---- item 5: labels bounded in count and range -----------------------------------------

def test_one_label_of_a_million_is_refused_before_any_class_is_built(tmp_path: Path) -> None:
    data = b.npz_bytes(images=_images(2), labels=np.array([0, 1_000_000]))
    started = time.monotonic()
    err = _error(tmp_path, data)
    assert err.code == ErrorCode.INVALID_DATASET
    assert f"[0, {limits.MAX_CLASSES})" in err.detail
    assert time.monotonic() - started < 1
    negative = b.npz_bytes(images=_images(2), labels=np.array([0, -1]))
    assert _error(tmp_path, negative).code == ErrorCode.INVALID_DATASET


def test_integer_labels_below_the_bound_are_accepted(tmp_path: Path) -> None:
    top = limits.MAX_CLASSES - 1
    data = _ingest(tmp_path, b.npz_bytes(images=_images(2), labels=np.array([0, top])))
    assert len(data.class_names) == limits.MAX_CLASSES


def test_the_class_count_is_bounded_for_every_format(tmp_path: Path) -> None:
    small = IngestLimits(LIMITS.archive, LIMITS.max_image_pixels, max_classes=3)
    cases: list[tuple[bytes, str, dict[str, Any]]] = [
        (b.npz_bytes(images=_images(4), labels=np.array([0, 1, 2, 3])), "u.npz", {}),
        (b.npz_bytes(images=_images(4), labels=np.array(["a", "b", "c", "d"])), "u.npz", {}),
        (b.npz_bytes(images=_images(2), labels=np.array([0, 1]),
                     class_names=np.array(["a", "b", "c", "d"])), "u.npz", {}),
        (b.zip_bytes(b.image_folder({"a": 1, "b": 1, "c": 1, "d": 1})), "u.zip", {}),
        (b.npz_bytes(images=_images(2), labels=np.array([0, 1])), "u.npz",
         {"domain": ["a", "b", "c", "d"], "private": True}),
        (_parquet([0, 1, 2, 3]), "u.parquet", {}),
    ]
    for data, name, kw in cases:
        err = _error(tmp_path, data, name, lim=small, **kw)
        assert err.code == ErrorCode.INVALID_DATASET and "3 classes" in err.detail, name
    # three are fine
    ok = _ingest(tmp_path, b.npz_bytes(images=_images(3), labels=np.array([0, 1, 2])),
                 lim=small)
    assert ok.class_names == ["0", "1", "2"]


def test_a_declared_domain_longer_than_the_limit_is_refused(tmp_path: Path) -> None:
    domain = [f"c{i}" for i in range(limits.MAX_CLASSES + 1)]
    err = _error(tmp_path, b.digits_npz(4, k=2), domain=domain, private=True)
    assert err.code == ErrorCode.INVALID_DATASET and "declared classes" in err.detail


def _parquet(labels: list[Any], *, size: tuple[int, int] = (8, 8)) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [b.png(*size, value=i) for i in range(len(labels))],
                      "label": labels})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_a_parquet_label_of_a_million_is_refused(tmp_path: Path) -> None:
    err = _error(tmp_path, _parquet([0, 1_000_000]), "u.parquet")
    assert err.code == ErrorCode.INVALID_DATASET and "outside" in err.detail


# ---- item 16: image sides, aspect ratio, private minimum --------------------------------

@pytest.mark.parametrize(("height", "width"), [(1, 1000), (4, 4), (7, 64), (8, 129),
                                               (200, 8)])
def test_images_too_small_or_too_narrow_are_refused(tmp_path: Path, height: int,
                                                   width: int) -> None:
    for data, name in [
            (b.npz_bytes(images=_images(3, height, width), labels=np.array([0, 1, 0])), "u.npz"),
            (b.zip_bytes(b.image_folder({"a": 2, "b": 1}, size=(width, height))), "u.zip"),
            (_parquet([0, 1, 0], size=(width, height)), "u.parquet")]:
        err = _error(tmp_path, data, name)
        assert err.code == ErrorCode.INVALID_DATASET and f"{width}x{height}" in err.detail
        private = _error(tmp_path, data, name, private=True, domain=["a", "b"])
        assert private.code == ErrorCode.INVALID_DATASET
        assert "8 pixels" in private.detail or "16 times" in private.detail
        if name != "u.npz":  # a decoded record is refused at once and never described
            assert f"{width}x{height}" not in private.detail
        for leak in (".png", "row", "a/", "b/"):
            assert leak not in private.detail, leak


def test_the_extreme_sides_of_the_bounds_are_accepted(tmp_path: Path) -> None:
    for height, width in [(8, 8), (8, 128), (128, 8)]:
        data = _ingest(tmp_path, b.npz_bytes(images=_images(2, height, width),
                                             labels=np.array([0, 1])))
        assert data.image_shape == [height, width, 1]


def test_one_wide_image_of_a_hundred_thousand_pixels_is_refused(tmp_path: Path) -> None:
    data = b.zip_bytes(b.image_folder({"a": 2}, size=(100_000, 1)))
    err = _error(tmp_path, data, "u.zip")
    assert err.code == ErrorCode.INVALID_DATASET and "100000x1" in err.detail


def test_a_private_dataset_of_one_image_is_refused_a_public_one_is_not(
        tmp_path: Path) -> None:
    one = b.zip_bytes(b.image_folder({"secret-name": 1}))
    err = _error(tmp_path, one, "u.zip", private=True, domain=["secret-name"])
    assert err.code == ErrorCode.INVALID_DATASET
    assert f"at least {limits.MIN_PRIVATE_RECORDS} images" in err.detail
    assert "0.png" not in err.detail and "secret-name" not in err.detail
    npz = b.npz_bytes(images=_images(1), labels=np.array([0]))
    assert _error(tmp_path, npz, private=True, domain=["a"]).code == ErrorCode.INVALID_DATASET
    assert _ingest(tmp_path, one, "u.zip").size == 1  # public: no minimum
    two = _ingest(tmp_path, b.npz_bytes(images=_images(2), labels=np.array([0, 0])),
                  private=True, domain=["a"])
    assert two.size == 2


def test_a_private_subject_dataset_counts_subjects(tmp_path: Path) -> None:
    one_subject = b.npz_bytes(images=_images(3), labels=np.array([0, 1, 0]),
                              subjects=np.array([7, 7, 7]))
    err = _error(tmp_path, one_subject, private=True, domain=["a", "b"],
                 subject_column="subjects")
    assert err.code == ErrorCode.INVALID_DATASET and "subjects" in err.detail
    assert "7" not in err.detail.replace(f"at least {limits.MIN_PRIVATE_RECORDS}", "")
    two = _ingest(tmp_path, b.npz_bytes(images=_images(3), labels=np.array([0, 1, 0]),
                                        subjects=np.array([7, 8, 7])),
                  private=True, domain=["a", "b"], subject_column="subjects")
    assert two.subject_count == 2


def test_bounds_are_documented_constants() -> None:
    assert (limits.MAX_CLASSES, limits.MIN_IMAGE_SIDE, limits.MAX_ASPECT_RATIO,
            limits.MIN_PRIVATE_RECORDS) == (10_000, 8, 16.0, 2)
    defaults = IngestLimits(LIMITS.archive, 1)
    assert defaults.max_classes == limits.MAX_CLASSES
