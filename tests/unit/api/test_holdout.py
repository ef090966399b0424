"""The held-out split at upload (datasets/holdout.py): sizes, stratification by class,
reproducibility from the seed, subjects never on both sides, refusals without counts."""

from __future__ import annotations

import numpy as np
import pytest
from dpsynth_api.datasets import holdout
from dpsynth_api.datasets.ingest import Ingested
from dpsynth_api.datasets.schemas import DatasetMetadata
from dpsynth_shared.errors import DpsynthError, ErrorCode
from pydantic import ValidationError


def _images(counts: list[int], *, subjects: np.ndarray | None = None) -> Ingested:
    labels = np.concatenate([np.full(n, c, dtype=np.int64) for c, n in enumerate(counts)])
    n = labels.shape[0]
    images = np.arange(n * 4, dtype=np.int64).reshape(n, 2, 2, 1).astype(np.uint8)
    images[:, 0, 0, 0] = np.arange(n) % 256
    return Ingested(images=images, labels=labels,
                    class_names=[f"c{i}" for i in range(len(counts))], source_format="npz",
                    subjects=subjects)


def test_sizes_are_rounded_and_stratified_by_class() -> None:
    data = _images([40, 20, 10])
    split = holdout.split_upload(data, 0.2, 123)
    assert split.holdout.size == 14 and split.train.size == 56 and split.seed == 123
    assert np.bincount(split.holdout.labels, minlength=3).tolist() == [8, 4, 2]
    assert split.train.class_names == data.class_names
    # every record lands on exactly one side
    both = np.concatenate([split.train.images[:, 0, 0, 0], split.holdout.images[:, 0, 0, 0]])
    assert sorted(both.tolist()) == sorted(data.images[:, 0, 0, 0].tolist())


def test_largest_remainder_keeps_the_total() -> None:
    split = holdout.split_upload(_images([3, 3, 3]), 0.5, 7)
    assert split.holdout.size == 5  # floor(4.5 + 0.5): quotas 1.5 each, two get the extra
    assert sorted(np.bincount(split.holdout.labels, minlength=3).tolist()) == [1, 2, 2]


def test_the_seed_reproduces_the_split_and_another_seed_changes_it() -> None:
    data = _images([50, 50])
    first = holdout.split_upload(data, 0.3, 99)
    again = holdout.split_upload(data, 0.3, 99)
    other = holdout.split_upload(data, 0.3, 100)
    assert np.array_equal(first.holdout.images, again.holdout.images)
    assert not np.array_equal(first.holdout.images, other.holdout.images)


def test_a_drawn_seed_is_recorded() -> None:
    split = holdout.split_upload(_images([10, 10]), 0.5, None)
    assert 0 <= split.seed <= holdout.MAX_SEED
    assert np.array_equal(holdout.split_upload(_images([10, 10]), 0.5, split.seed)
                          .holdout.images, split.holdout.images)


def test_one_unit_each_side_or_422_without_a_count() -> None:
    with pytest.raises(DpsynthError) as info:
        holdout.split_upload(_images([2, 1]), 0.1, 1)
    assert info.value.code == ErrorCode.INVALID_DATASET
    assert "3" not in info.value.detail


def test_subjects_are_never_split_and_are_renumbered() -> None:
    subjects = np.repeat(np.arange(20), 3)  # 20 subjects of 3 images each
    labels_counts = [30, 30]
    data = _images(labels_counts, subjects=subjects)
    split = holdout.split_upload(data, 0.25, 5)
    assert split.holdout_units == 5 and split.holdout.size == 15
    assert split.train.subjects is not None and split.holdout.subjects is not None
    assert split.train.subject_count == 15 and split.holdout.subject_count == 5
    held = {int(v) for v in split.holdout.images[:, 0, 0, 0]}
    kept = {int(v) for v in split.train.images[:, 0, 0, 0]}
    for subject in range(20):
        ids = {int(i) for i in np.flatnonzero(subjects == subject)}
        assert ids <= held or ids <= kept


def test_metadata_bounds() -> None:
    base = {"name": "d", "visibility": "public"}
    assert DatasetMetadata.model_validate({**base, "holdout_fraction": 0.5}).holdout_fraction
    for bad in ({"holdout_fraction": 0.6}, {"holdout_fraction": 0},
                {"holdout_seed": 3}, {"holdout_fraction": 0.2, "holdout_seed": -1}):
        with pytest.raises(ValidationError):
            DatasetMetadata.model_validate({**base, **bad})


def test_holdout_key_sits_beside_the_object() -> None:
    assert holdout.holdout_key("private/datasets/ds_x/data.npz") == \
        "private/datasets/ds_x/holdout.npz"
    assert holdout.holdout_key("private/datasets/b/linked/ds_y/data.npz") == \
        "private/datasets/b/linked/ds_y/holdout.npz"
