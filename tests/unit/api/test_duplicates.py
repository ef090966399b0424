"""Copies of one record inside one upload (issue 13, item 4): ``datasets/duplicates.py``.

Before the fix, six images with five distinct contents were six records: the repeated one was
protected only at group size 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import overlap
from dpsynth_api.datasets.duplicates import find_copies, resolve_duplicates
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, ingest_upload
from dpsynth_shared.errors import DpsynthError, ErrorCode

from tests.unit.api import builders as b


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 4, 4, 1), dtype=np.uint8)


def _six_with_a_copy(**extra: np.ndarray | None) -> Ingested:
    """Six records, five distinct: record 4 repeats record 1 (same label)."""
    images = _images(5)
    images = np.concatenate([images[:4], images[1:2], images[4:]])
    labels = np.asarray([0, 1, 2, 0, 1, 2], dtype=np.int64)
    return Ingested(images, labels, ["a", "b", "c"], "npz", **extra)  # type: ignore[arg-type]


def _refused(data: Ingested, **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        resolve_duplicates(data, **kw)  # type: ignore[arg-type]
    err = info.value
    assert err.code == ErrorCode.DUPLICATE_RECORDS and err.status == 422
    for h in overlap.record_hashes(data.images):  # counts only: no hash, no index
        assert h not in err.detail and h[:12] not in err.detail
    assert "index" not in err.detail and "row" not in err.detail
    return err


def test_a_private_upload_with_a_copy_is_refused_with_the_count_only() -> None:
    data = _six_with_a_copy()
    err = _refused(data, on_duplicate=None, private=True)
    assert err.extensions == {"duplicate_records": 1, "disagreeing_records": 0}
    assert "1 record(s)" in err.detail and "on_duplicate 'deduplicate'" in err.detail
    err = _refused(data, on_duplicate="refuse", private=True)
    assert err.extensions["duplicate_records"] == 1


def test_k_copies_count_k_minus_one() -> None:
    images = np.repeat(_images(1), 4, axis=0)
    data = Ingested(images, np.zeros(4, dtype=np.int64), ["a"], "npz")
    copies = find_copies(data, overlap.record_hashes(images))
    assert copies.count == 3 and copies.keep.tolist() == [True, False, False, False]


def test_deduplicate_keeps_the_first_copy_and_its_hash() -> None:
    masks = np.arange(6, dtype=np.uint8).reshape(6, 1, 1, 1) * np.ones((1, 4, 4, 1), np.uint8)
    masks[4] = masks[1]  # the copy's mask agrees with its first copy's
    data = _six_with_a_copy(masks=masks)
    kept, hashes = resolve_duplicates(data, on_duplicate="deduplicate", private=True)
    assert kept.size == 5
    order = [0, 1, 2, 3, 5]
    assert np.array_equal(kept.images, data.images[order])
    assert kept.labels.tolist() == [0, 1, 2, 0, 2]
    assert kept.masks is not None and np.array_equal(kept.masks, masks[order])
    assert hashes == overlap.record_hashes(kept.images)
    assert len(set(hashes)) == 5


def test_copies_under_another_label_or_mask_are_refused_even_when_deduplicating() -> None:
    data = _six_with_a_copy()
    data.labels[4] = 2  # the same pixels in class b and class c
    for mode in ("refuse", "deduplicate", None):
        err = _refused(data, on_duplicate=mode, private=True)
        assert err.extensions == {"duplicate_records": 1, "disagreeing_records": 1}
        assert "another label or layout mask" in err.detail
    masks = np.zeros((6, 4, 4, 1), dtype=np.uint8)
    masks[4, 0, 0, 0] = 1
    err = _refused(_six_with_a_copy(masks=masks), on_duplicate="deduplicate", private=True)
    assert err.extensions["disagreeing_records"] == 1


def test_a_subject_upload_dedupes_within_a_subject_and_refuses_across_subjects() -> None:
    same = _six_with_a_copy(subjects=np.asarray([0, 1, 2, 0, 1, 2]),
                            subject_ids=["p1", "p2", "p3"])
    kept, _ = resolve_duplicates(same, on_duplicate="deduplicate", private=True)
    assert kept.subjects is not None and kept.subjects.tolist() == [0, 1, 2, 0, 2]
    assert kept.subject_count == 3 and kept.subject_ids == ["p1", "p2", "p3"]
    _refused(same, on_duplicate=None, private=True)  # the default refuses any copy
    # the same image under two subjects: one record cannot be two people's
    two = _six_with_a_copy(subjects=np.asarray([0, 1, 2, 0, 3, 2]),
                           subject_ids=["p1", "p2", "p3", "p4"])
    err = _refused(two, on_duplicate="deduplicate", private=True)
    assert err.extensions["disagreeing_records"] == 1
    assert "subject" in err.detail and "p2" not in err.detail and "p4" not in err.detail


def test_a_public_upload_keeps_its_copies_unless_told_otherwise() -> None:
    data = _six_with_a_copy()
    kept, hashes = resolve_duplicates(data, on_duplicate=None, private=False)
    assert kept is data and len(hashes) == 6
    kept, hashes = resolve_duplicates(data, on_duplicate="deduplicate", private=False)
    assert kept.size == 5 and len(set(hashes)) == 5
    _refused(data, on_duplicate="refuse", private=False)


def test_an_upload_without_copies_is_unchanged() -> None:
    data = Ingested(_images(6), np.arange(6, dtype=np.int64) % 3, ["a", "b", "c"], "npz")
    kept, hashes = resolve_duplicates(data, on_duplicate=None, private=True)
    assert kept is data and hashes == overlap.record_hashes(data.images)


def test_a_png_folder_copy_is_found_through_canonical_pixels(tmp_path: Path) -> None:
    """Two files of one image in an archive are one record (the hash is over pixels)."""
    members = {"a/0.png": b.png(value=5), "a/1.png": b.png(value=9),
               "b/2.png": b.png(value=5)}
    path = tmp_path / "u.zip"
    path.write_bytes(b.zip_bytes(members))
    data = ingest_upload(path, "u.zip", private=True, label_domain=["a", "b"],
                         limits=IngestLimits(ArchiveLimits(1 << 24, 100), 1 << 20))
    err = _refused(data, on_duplicate="deduplicate", private=True)  # a/0 vs b/2: labels
    assert err.extensions == {"duplicate_records": 1, "disagreeing_records": 1}
    assert "0.png" not in err.detail and "2.png" not in err.detail


def test_a_subjects_csv_giving_one_image_two_subjects_is_refused(tmp_path: Path) -> None:
    """Disagreeing subject ids in the csv (regression pin: refused at ingest before too)."""
    members = {"data/a/0.png": b.png(value=1), "data/a/1.png": b.png(value=2),
               "data/subjects.csv": b"path,subject\ndata/a/0.png,patient-1\n"
                                    b"a/0.png,patient-2\na/1.png,patient-1\n"}
    members_twice = {**members, "data/subjects.csv": b"path,subject\na/0.png,patient-1\n"
                                                     b"a/0.png,patient-2\na/1.png,patient-1\n"}
    for case in (members, members_twice):
        path = tmp_path / "u.zip"
        path.write_bytes(b.zip_bytes(case))
        with pytest.raises(DpsynthError) as info:
            ingest_upload(path, "u.zip", private=True, label_domain=["a"],
                          limits=IngestLimits(ArchiveLimits(1 << 24, 100), 1 << 20),
                          subject_column="subjects")
        assert info.value.code == ErrorCode.INVALID_DATASET
        assert "patient" not in info.value.detail and "0.png" not in info.value.detail
