"""The worker's keyed-hash split of a derived dataset (runners/selection.py, issue 13 item 1).

A derived split keeps the parent's records whose keyed content hash falls below the
fraction (train) or not (holdout), after the class filter of a ``--classes`` subset: adding
or removing one record of the parent changes the child by at most that record, whatever it
is and wherever it sits; the two parts are complementary; the selection carries the rule
and fails closed on one it does not know."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.record_splits import in_first_part, record_hashes
from dpsynth_shared.stores.local import LocalDirStore
from dpsynth_shared.worker_contract import DatasetInfo
from dpsynth_worker.runners.selection import apply_selection, fetch_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEY = "ab" * 32
NAMES = ["x", "y", "z"]


def _write(path: Path, codes: list[int]) -> Path:
    """A canonical npz with one 2x2 record per code (label: code % 3), masks and subjects."""
    images = np.zeros((len(codes), 2, 2, 1), dtype=np.uint8)
    for i, code in enumerate(codes):
        images[i, :, :, 0] = np.frombuffer(code.to_bytes(4, "big"), dtype=np.uint8)\
            .reshape(2, 2)
    np.savez(path, images=images, labels=np.asarray([c % 3 for c in codes], dtype=np.int64),
             class_names=np.asarray(NAMES), masks=images + 1,
             subjects=np.arange(len(codes), dtype=np.int64))
    return path


def _child(tmp: Path, codes: list[int], *, classes: list[str] | None,
           split: dict[str, object] | None, name: str = "child") -> Counter[str]:
    source = _write(tmp / f"{name}-parent.npz", codes)
    out = tmp / f"{name}.npz"
    apply_selection(source, out, classes=classes, indices=None, split=split)
    with np.load(out, allow_pickle=False) as npz:
        return Counter(record_hashes(npz["images"]))


def _split(fraction: float, part: str) -> dict[str, object]:
    return {"rule": "keyed_hash_v1", "key": KEY, "fraction": fraction, "part": part}


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(codes=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=60),
       new=st.integers(0, 2**32 - 1), where=st.integers(0, 60), remove=st.booleans(),
       fraction=st.sampled_from([0.2, 0.5, 0.8]), part=st.sampled_from(["train", "holdout"]),
       classes=st.sampled_from([None, ["x"], ["x", "z"], ["y", "z"]]),
       split=st.booleans())
def test_one_record_more_or_less_in_the_parent_changes_the_child_by_at_most_it(
        tmp_path: Path, codes: list[int], new: int, where: int, remove: bool,
        fraction: float, part: str, classes: list[str] | None, split: bool) -> None:
    if not split and classes is None:
        classes = ["y"]  # a --classes subset alone: the per-record label rule
    if remove:
        changed = codes[where % len(codes)]
        other = codes[:where % len(codes)] + codes[where % len(codes) + 1:]
    else:
        changed = new
        other = [*codes[:where], new, *codes[where:]]
    rule = _split(fraction, part) if split else None
    first = _child(tmp_path, codes, classes=classes, split=rule, name="a")
    second = _child(tmp_path, other, classes=classes, split=rule, name="b")
    (changed_hash,) = record_hashes(np.frombuffer(changed.to_bytes(4, "big"), dtype=np.uint8)
                                    .reshape(1, 2, 2, 1))
    diff = (first - second) + (second - first)
    assert set(diff) <= {changed_hash} and sum(diff.values()) <= 1


def test_the_parts_are_complementary_and_follow_the_shared_rule(tmp_path: Path) -> None:
    codes = list(range(300))
    train = _child(tmp_path, codes, classes=["x", "z"], split=_split(0.7, "train"), name="t")
    held = _child(tmp_path, codes, classes=["x", "z"], split=_split(0.7, "holdout"), name="h")
    subset = _child(tmp_path, codes, classes=["x", "z"], split=None, name="s")
    assert not set(train) & set(held) and train + held == subset
    hashes = list(subset)
    expected = {h for h, side in zip(hashes, in_first_part(bytes.fromhex(KEY), hashes, 0.7),
                                     strict=True) if side}
    assert set(train) == expected
    assert 0.55 < len(train) / len(subset) < 0.85  # about the fraction, not a quota


def test_records_keep_their_masks_subjects_and_renumbered_labels(tmp_path: Path) -> None:
    source = _write(tmp_path / "p.npz", list(range(40)))
    out = tmp_path / "c.npz"
    apply_selection(source, out, classes=["y", "z"], indices=None, split=_split(0.5, "train"))
    with np.load(out, allow_pickle=False) as npz:
        assert np.array_equal(npz["masks"], npz["images"] + 1)
        assert npz["class_names"].tolist() == ["y", "z"]
        assert set(npz["labels"].tolist()) <= {0, 1}
        assert npz["subjects"].tolist() == list(range(npz["images"].shape[0]))


def test_the_worker_fetches_a_keyed_split_of_a_subset(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "objects")
    store.put_file("public/datasets/ds_p/data.npz", _write(tmp_path / "w.npz", list(range(90))))
    info = DatasetInfo(dataset_id="ds_c", visibility="public",
                       object_key="public/datasets/ds_p/data.npz", class_names=["y"],
                       selection={"classes": ["y"], "split": _split(0.5, "holdout")})
    work = tmp_path / "work"
    work.mkdir()
    out = fetch_dataset(SimpleNamespace(store=store), info, work / "data.npz")  # type: ignore[arg-type]
    assert sorted(p.name for p in work.iterdir()) == ["data.npz"]
    expected = _child(tmp_path, list(range(90)), classes=["y"], split=_split(0.5, "holdout"))
    with np.load(out, allow_pickle=False) as npz:
        assert Counter(record_hashes(npz["images"])) == expected


@pytest.mark.parametrize("split", [
    {"rule": "seeded_permutation_v0", "key": KEY, "fraction": 0.5, "part": "train"},
    {"rule": "keyed_hash_v1", "key": "not-hex", "fraction": 0.5, "part": "train"},
    {"rule": "keyed_hash_v1", "key": KEY, "fraction": 0.5, "part": "both"},
    {"rule": "keyed_hash_v1", "fraction": 0.5, "part": "train"},
])
def test_an_unknown_or_malformed_split_fails_closed(tmp_path: Path,
                                                    split: dict[str, object]) -> None:
    with pytest.raises(DpsynthError) as info:
        apply_selection(_write(tmp_path / "p.npz", [1, 2, 3]), tmp_path / "c.npz",
                        classes=None, indices=None, split=split)
    assert info.value.code == ErrorCode.INVALID_DATASET
