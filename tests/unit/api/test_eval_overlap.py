"""The pure parts of the held-out overlap check (issue 15, item 8): what a derived dataset's
selection keeps of the shared rows, which rows count, and the caveat of an unchecked check."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from dpsynth_api.jobs.eval_overlap import HoldoutCheck, Trained, kept_by_selection
from dpsynth_api.tables import Dataset
from dpsynth_shared.record_splits import in_first_part

HASHES = [f"{i:064x}" for i in range(200)]
KEY = bytes(range(16))


class Row(NamedTuple):
    dataset_id: str
    record_hash: str
    label: int | None
    held_out: bool | None
    unit_row: bool


def _trained(derivation: dict[str, Any] | None) -> Trained:
    upload = Dataset(id="ds_up", class_names=["x", "y", "z"], visibility="private",
                     derivation=None, parent_id=None)
    child = upload if derivation is None else Dataset(
        id="ds_child", class_names=["x", "y", "z"], visibility="private",
        derivation=derivation, parent_id="ds_up")
    return Trained(dataset=child, upload=upload, model_id="mdl_1", job_id="job_1",
                   job_type="finetune", role="the model that generated the corpus")


def _rows() -> list[Row]:
    return [Row("ds_up", h, i % 3, False, False) for i, h in enumerate(HASHES)]


def test_an_upload_keeps_every_shared_training_row() -> None:
    rows, exact = kept_by_selection(_trained(None), _rows())
    assert len(rows) == len(HASHES) and exact


def test_a_subset_keeps_its_classes_and_the_subject_rows() -> None:
    subject = Row("ds_up", "f" * 64, None, False, True)
    trained = _trained({"kind": "subset", "selection": {"classes": ["y"]}})
    rows, exact = kept_by_selection(trained, [*_rows(), subject])
    assert exact and subject in rows
    assert {r.label for r in rows if not r.unit_row} == {1}
    assert len(rows) == sum(1 for i in range(len(HASHES)) if i % 3 == 1) + 1


def test_the_two_parts_of_a_split_keep_complementary_rows() -> None:
    first = in_first_part(KEY, HASHES, 0.5)
    kept = {}
    for part in ("train", "holdout"):
        split = {"rule": "keyed_hash_v1", "key": KEY.hex(), "fraction": 0.5, "part": part}
        trained = _trained({"kind": "split", "selection": {"split": split}})
        rows, exact = kept_by_selection(trained, _rows())
        assert exact
        kept[part] = {r.record_hash for r in rows}
    assert kept["train"] == {h for h, f in zip(HASHES, first.tolist(), strict=True) if f}
    assert kept["train"].isdisjoint(kept["holdout"])
    assert kept["train"] | kept["holdout"] == set(HASHES)
    assert 0 < len(kept["train"]) < len(HASHES) and np.any(first)


def test_a_split_made_before_issue_13_is_not_exact() -> None:
    trained = _trained({"kind": "split", "selection": {"indices_key": "k", "classes": ["x"]}})
    _, exact = kept_by_selection(trained, _rows())
    assert not exact


def test_the_caveat_names_what_was_not_checked() -> None:
    clear = HoldoutCheck(checked=["ds_a", "ds_a"], unknown_models=["mdl_u"])
    assert clear.status == "no_overlap" and clear.caveat() is None
    assert clear.block() == {"status": "no_overlap", "checked_datasets": ["ds_a"],
                             "unchecked": [], "models_of_unknown_training_data": ["mdl_u"],
                             "caveat": None}
    unsure = HoldoutCheck(unchecked=[{"what": "dataset ds_p", "why": "owner scope"}])
    caveat = unsure.caveat()
    assert unsure.status == "unchecked" and caveat is not None
    assert caveat.startswith("held-out overlap not checked") and "dataset ds_p" in caveat
    assert unsure.block()["caveat"] == caveat
