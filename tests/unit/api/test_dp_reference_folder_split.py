"""A DP evaluation needs a public held-out size, which a split folder (holdout_from) has not."""

from __future__ import annotations

import pytest
from dpsynth_api.jobs.kinds.evaluate import check_dp_reference
from dpsynth_api.tables import Dataset
from dpsynth_shared.errors import DpsynthError


def _reference(**fields: object) -> Dataset:
    base: dict[str, object] = dict(id="ds_ref", visibility="private", privacy_unit="image",
                                   parent_id=None, derivation=None, declared_size=1000)
    return Dataset(**{**base, **fields})


def test_a_split_folder_reference_is_refused_with_the_way_out() -> None:
    with pytest.raises(DpsynthError) as err:
        check_dp_reference(_reference(holdout_rule="folder_split_v1", holdout_fraction=None))
    assert "split folder (holdout_from)" in err.value.detail
    assert "holdout_fraction instead" in err.value.detail
    check_dp_reference(_reference(holdout_rule="keyed_hash_v1", holdout_fraction=0.1))
