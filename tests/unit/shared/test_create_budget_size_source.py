"""CreateBudget records how N̂ was made public (issue 13, item 2), and refuses mismatches."""

from __future__ import annotations

import pytest
from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.ledger_contract import CreateBudget
from dpsynth_shared.release_contract import SizeRelease
from pydantic import ValidationError

BASE = {"dataset_id": "ds_1", "tenant_id": "ten_1", "epsilon_limit": 4.0, "delta": 1e-6,
        "declared_size": 1000}
RELEASE = SizeRelease(release_id="release_1", target_epsilon=0.1, sigma=30.0, margin_z=6.0,
                      failure_probability=1e-9)


def test_the_source_defaults_from_the_release() -> None:
    assert CreateBudget(**BASE).declared_size_source == "declared"
    assert CreateBudget(**BASE, size_release=RELEASE).declared_size_source == "dp_count"
    replace = CreateBudget(**BASE, neighbouring=Neighbouring.REPLACE_ONE,
                           declared_size_source="true_count")
    assert replace.declared_size_source == "true_count"


@pytest.mark.parametrize("fields", [
    {"declared_size_source": "dp_count"},                         # a DP count with no release
    {"declared_size_source": "declared", "size_release": RELEASE},  # a release called declared
    {"declared_size_source": "true_count"},                        # add/remove: N is private
])
def test_a_source_that_does_not_match_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CreateBudget(**BASE, **fields)  # type: ignore[arg-type]
