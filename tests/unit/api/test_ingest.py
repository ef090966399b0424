"""Upload validation without a database: archives, images, npz, bombs, private messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits, SafeArchive
from dpsynth_api.datasets.ingest import IngestLimits, ingest_upload, write_canonical
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=1024 * 1024)


def _ingest(tmp_path: Path, data: bytes, name: str = "upload.zip", *, private: bool = False,
            domain: list[str] | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / "upload"
    path.write_bytes(data)
    return ingest_upload(path, name, private=private, label_domain=domain, limits=LIMITS)


def _error(tmp_path: Path, data: bytes, name: str = "upload.zip", **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        _ingest(tmp_path, data, name, **kw)  # type: ignore[arg-type]
    return info.value


def test_zip_image_folder_is_converted_to_canonical_arrays(tmp_path: Path) -> None:
    data = _ingest(tmp_path, b.zip_bytes(b.image_folder({"cat": 3, "dog": 2}, root="data/")))
    assert data.images.shape == (5, 8, 8, 1)
    assert data.images.dtype == np.uint8
    assert data.class_names == ["cat", "dog"]
    assert data.class_counts() == {"cat": 3, "dog": 2}
    assert sorted(data.labels.tolist()) == [0, 0, 0, 1, 1]
    out = write_canonical(data, tmp_path / "c.npz")
    with np.load(out, allow_pickle=False) as npz:
        assert npz["class_names"].tolist() == ["cat", "dog"]
        assert npz["labels"].dtype == np.int64


def test_colour_and_gray_images_become_rgb(tmp_path: Path) -> None:
    members = {**b.image_folder({"a": 1}), "b/x.png": b.png(mode="RGB", value=9)}
    data = _ingest(tmp_path, b.tar_bytes(members, gz=True), "upload.tar.gz")
    assert data.images.shape == (2, 8, 8, 3)
    assert data.source_format == "tar"


def test_a_private_upload_mixing_colour_and_gray_is_refused(tmp_path: Path) -> None:
    """One colour record must not turn a private dataset's published shape RGB (issue 13)."""
    members = {**b.image_folder({"a": 2}), "b/x.png": b.png(mode="RGB", value=9)}
    error = _error(tmp_path, b.zip_bytes(members), private=True, domain=["a", "b"])
    assert error.code == ErrorCode.INVALID_DATASET
    assert "grayscale and colour" in error.detail
    assert "x.png" not in error.detail
    colour = {"a/1.png": b.png(mode="RGB", value=1), "b/x.png": b.png(mode="RGB", value=9)}
    data = _ingest(tmp_path, b.zip_bytes(colour), private=True, domain=["a", "b"])
    assert data.images.shape == (2, 8, 8, 3)


def test_label_domain_orders_classes_and_counts_empty_ones(tmp_path: Path) -> None:
    data = _ingest(tmp_path, b.zip_bytes(b.image_folder({"b": 2})), domain=["a", "b", "c"],
                   private=True)
    assert data.class_names == ["a", "b", "c"]
    assert data.class_counts() == {"a": 0, "b": 2, "c": 0}
    assert data.labels.tolist() == [1, 1]


@pytest.mark.parametrize(("members", "code"), [
    ({"../evil/x.png": b.png()}, ErrorCode.UNSAFE_ARCHIVE),
    ({"/abs/x.png": b.png()}, ErrorCode.UNSAFE_ARCHIVE),
    ({"cls/notes.txt": b"hello"}, ErrorCode.INVALID_IMAGE),
    ({"cls/x.png": b.png()[:30]}, ErrorCode.INVALID_IMAGE),
    ({"cls/bomb.png": b.bomb_png()}, ErrorCode.UNSAFE_ARCHIVE),
    ({"a/x.png": b.png(8, 8), "b/y.png": b.png(16, 8)}, ErrorCode.INVALID_DATASET),
    ({"x.png": b.png()}, ErrorCode.INVALID_DATASET),
])
def test_bad_zip_members_are_refused(tmp_path: Path, members: dict[str, bytes],
                                     code: ErrorCode) -> None:
    assert _error(tmp_path, b.zip_bytes(members)).code == code


@pytest.mark.parametrize("kw", [{"symlinks": {"cls/link.png": "/etc/passwd"}},
                                {"hardlinks": {"cls/hard.png": "cls/0.png"}},
                                {"devices": ["cls/dev"]}])
def test_tar_links_and_devices_are_unsafe(tmp_path: Path, kw: dict[str, object]) -> None:
    data = b.tar_bytes(b.image_folder({"cls": 1}), **kw)  # type: ignore[arg-type]
    err = _error(tmp_path, data, "u.tar")
    assert err.code == ErrorCode.UNSAFE_ARCHIVE
    assert "link" in err.detail or "device" in err.detail


def test_zip_symlink_is_unsafe(tmp_path: Path) -> None:
    data = b.zip_bytes(b.image_folder({"cls": 1}), symlinks={"cls/l.png": "/etc/passwd"})
    assert _error(tmp_path, data).code == ErrorCode.UNSAFE_ARCHIVE


def test_zip_bomb_is_refused_before_inflating(tmp_path: Path) -> None:
    bomb = b.zip_bomb(20 * 1024 * 1024)
    assert len(bomb) < 100_000
    err = _error(tmp_path, bomb)
    assert err.code == ErrorCode.UNSAFE_ARCHIVE
    assert "bomb" in err.detail


def test_too_many_members_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.zip"
    path.write_bytes(b.zip_bytes({f"c/{i}.png": b"" for i in range(20)}))
    with pytest.raises(DpsynthError) as info:
        SafeArchive(path, ArchiveLimits(10**9, 10), private=False)
    assert info.value.code == ErrorCode.UNSAFE_ARCHIVE


def test_corrupt_archive_is_invalid(tmp_path: Path) -> None:
    assert _error(tmp_path, b"PK\x03\x04this is not a zip at all").code == ErrorCode.INVALID_ARCHIVE
    truncated = b.tar_bytes(b.image_folder({"c": 3}), gz=True)[:-40]
    assert _error(tmp_path, truncated, "u.tar.gz").code == ErrorCode.INVALID_ARCHIVE


def test_private_errors_never_name_members(tmp_path: Path) -> None:
    members = {"patient-smith/scan.txt": b"not an image", "patient-smith/ok.png": b.png()}
    public = _error(tmp_path, b.zip_bytes(members), domain=None)
    private = _error(tmp_path, b.zip_bytes(members), private=True, domain=["patient-smith"])
    assert "scan.txt" in public.detail
    assert "scan.txt" not in private.detail and "smith" not in private.detail
    outside = _error(tmp_path, b.zip_bytes({"alice/x.png": b.png()}), private=True,
                     domain=["bob"])
    assert outside.code == ErrorCode.INVALID_DATASET and "alice" not in outside.detail


def test_npz_with_int_and_string_labels(tmp_path: Path) -> None:
    data = _ingest(tmp_path, b.digits_npz(12, k=3), "d.npz", domain=["x", "y", "z"])
    assert data.images.shape == (12, 8, 8, 1)
    assert data.class_counts() == {"x": 4, "y": 4, "z": 4}
    named = _ingest(tmp_path, b.digits_npz(6, k=2, string_labels=True), "d.npz")
    assert named.class_names == ["c0", "c1"]


def test_npz_refusals(tmp_path: Path) -> None:
    pickled = b.npz_bytes(images=np.zeros((2, 4, 4), np.uint8),
                          labels=np.array([{"x": 1}, None], dtype=object))
    assert _error(tmp_path, pickled, "p.npz").code == ErrorCode.UNSAFE_NPZ
    floats = b.npz_bytes(images=np.zeros((2, 4, 4), np.float32), labels=np.zeros(2, int))
    assert _error(tmp_path, floats, "f.npz").code == ErrorCode.INVALID_DATASET
    out_of_domain = b.npz_bytes(images=np.zeros((2, 4, 4), np.uint8), labels=np.array([0, 5]))
    err = _error(tmp_path, out_of_domain, "o.npz", domain=["a", "b"])
    assert err.code == ErrorCode.INVALID_DATASET and "1 label" in err.detail
