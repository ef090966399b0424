"""Record content hashes: canonical pixels, whatever the container; fast; and the worker's
selection of a derived dataset (classes, then the indices of a split made before issue 13;
masks and subjects with their records). Keyed-hash splits: tests/unit/worker/
test_split_selection.py."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import numpy as np
from dpsynth_api.datasets.overlap import HASH_SCHEME, record_hashes
from dpsynth_worker.runners.selection import apply_selection

from tests.unit.api import builders as b
from tests.unit.api.test_ingest import _ingest


def test_a_png_folder_and_an_npz_of_the_same_images_hash_the_same(tmp_path: Path) -> None:
    folder = _ingest(tmp_path, b.zip_bytes(b.image_folder({"a": 2, "b": 3}, root="data/")))
    # the same pixels as an npz [N,H,W] (no channel axis), in another order
    order = [4, 0, 3, 1, 2]
    npz = _ingest(tmp_path, b.npz_bytes(images=folder.images[order, :, :, 0],
                                        labels=folder.labels[order]), "d.npz")
    assert sorted(record_hashes(folder.images)) == sorted(record_hashes(npz.images))
    assert [record_hashes(folder.images)[i] for i in order] == record_hashes(npz.images)


def test_the_hash_is_sha256_of_scheme_dtype_shape_and_bytes() -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4, 1)
    expected = hashlib.sha256(f"{HASH_SCHEME}||u1|3x4x1|".encode()
                              + images[1].tobytes()).hexdigest()
    assert record_hashes(images)[1] == expected


def test_the_shape_and_every_pixel_count() -> None:
    base = np.zeros((1, 4, 4, 1), dtype=np.uint8)
    other = base.copy()
    other[0, 3, 3, 0] = 1
    flat = np.zeros((1, 2, 8, 1), dtype=np.uint8)  # same bytes, another shape
    hashes = {record_hashes(x)[0] for x in (base, other, flat)}
    assert len(hashes) == 3
    assert record_hashes(np.concatenate([base, base]))[0] == record_hashes(base)[0]


def test_seventy_thousand_mnist_sized_records_hash_in_well_under_seconds() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(70_000, 28, 28, 1),
                                               dtype=np.uint8)
    start = time.perf_counter()
    hashes = record_hashes(images)
    elapsed = time.perf_counter() - start
    assert len(hashes) == len(set(hashes)) == 70_000
    print(f"70k 28x28 records hashed in {elapsed:.3f} s")  # informative, not asserted


def _canonical(tmp_path: Path) -> Path:
    images = np.arange(6, dtype=np.uint8).repeat(4).reshape(6, 2, 2, 1)
    masks = (images + 100).astype(np.uint8)
    path = tmp_path / "whole.npz"
    np.savez(path, images=images, labels=np.asarray([0, 1, 2, 0, 1, 2]),
             class_names=np.asarray(["x", "y", "z"]), masks=masks,
             subjects=np.asarray([0, 1, 2, 3, 4, 5]))
    return path


def test_a_class_subset_keeps_its_records_with_their_masks_and_renumbers_labels(
        tmp_path: Path) -> None:
    out = tmp_path / "child.npz"
    apply_selection(_canonical(tmp_path), out, classes=["x", "z"], indices=None)
    with np.load(out, allow_pickle=False) as npz:
        assert npz["images"][:, 0, 0, 0].tolist() == [0, 2, 3, 5]
        assert npz["masks"][:, 0, 0, 0].tolist() == [100, 102, 103, 105]
        assert npz["labels"].tolist() == [0, 1, 0, 1]
        assert npz["class_names"].tolist() == ["x", "z"]
        assert npz["subjects"].tolist() == [0, 1, 2, 3]


def test_indices_select_after_the_class_filter(tmp_path: Path) -> None:
    out = tmp_path / "child.npz"
    apply_selection(_canonical(tmp_path), out, classes=["x", "z"],
                    indices=np.asarray([1, 3]))
    with np.load(out, allow_pickle=False) as npz:
        assert npz["images"][:, 0, 0, 0].tolist() == [2, 5]
        assert npz["labels"].tolist() == [1, 1]


def test_the_worker_fetches_a_split_of_a_subset(tmp_path: Path) -> None:
    """fetch_dataset downloads the parent's object and the indices, applies classes then
    indices, and leaves only the selected npz behind."""
    from types import SimpleNamespace

    from dpsynth_shared.stores.local import LocalDirStore
    from dpsynth_shared.worker_contract import DatasetInfo
    from dpsynth_worker.runners.selection import fetch_dataset

    store = LocalDirStore(tmp_path / "objects")
    store.put_file("public/datasets/ds_p/data.npz", _canonical(tmp_path))
    buffer = io.BytesIO()
    np.save(buffer, np.asarray([0, 2], dtype=np.int64))
    store.put_bytes("public/datasets/ds_p/derived/ds_c/indices.npy", buffer.getvalue())
    info = DatasetInfo(dataset_id="ds_c", visibility="public",
                       object_key="public/datasets/ds_p/data.npz", class_names=["y", "z"],
                       selection={"classes": ["y", "z"],
                                  "indices_key": "public/datasets/ds_p/derived/ds_c/indices.npy"})
    work = tmp_path / "work"
    work.mkdir()
    out = fetch_dataset(SimpleNamespace(store=store), info, work / "data.npz")  # type: ignore[arg-type]
    assert sorted(p.name for p in work.iterdir()) == ["data.npz"]
    with np.load(out, allow_pickle=False) as npz:
        assert npz["images"][:, 0, 0, 0].tolist() == [1, 4]  # y, z, y, z -> positions 0, 2
        assert npz["labels"].tolist() == [0, 0]
        assert npz["class_names"].tolist() == ["y", "z"]
