"""Which references a DP evaluation accepts, and its plan (issue 13, item 6)."""

from __future__ import annotations

from typing import Any

import pytest
from dpsynth_api.jobs.kinds.evaluate import check_dp_reference, dp_plan, evaluation_privacy
from dpsynth_api.tables import Dataset
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.job_specs import EvaluateSpec


def _dataset(**overrides: Any) -> Dataset:
    values: dict[str, Any] = {"id": "ds_1", "visibility": "private", "declared_size": 900,
                              "holdout_fraction": 0.1, "privacy_unit": "image",
                              "parent_id": None, "derivation": None, "budget_id": None}
    values.update(overrides)
    return Dataset(**values)


@pytest.mark.parametrize(("overrides", "why"), [
    ({"visibility": "public"}, "public"),
    ({"parent_id": "ds_0"}, "derived"),
    ({"privacy_unit": "subject"}, "subject"),
    ({"holdout_fraction": None}, "public held-out size"),
])
def test_refused_references(overrides: dict[str, Any], why: str) -> None:
    with pytest.raises(DpsynthError) as err:
        check_dp_reference(_dataset(**overrides))
    assert err.value.code == "invalid_spec" and why in err.value.detail


def test_the_plan_uses_public_values_only() -> None:
    check_dp_reference(_dataset())
    spec = EvaluateSpec(corpus_artifact_id="art_1", dataset_id="ds_1",
                        classifiers=["cnn", "logreg", "mlp"],
                        dp={"target_epsilon": 0.5})  # type: ignore[arg-type]
    plan = dp_plan(_dataset(), spec)
    assert plan is not None
    assert plan["holdout_size"] == 100  # round(900 · 0.1 / 0.9)
    assert plan["sensitivity"] == pytest.approx(3 ** 0.5) and plan["partition"] == "*holdout"
    assert plan["metrics"] == ["tstr_accuracy/cnn", "tstr_accuracy/logreg",
                               "tstr_accuracy/mlp"]
    block = evaluation_privacy(_dataset(), "evl_1", spec)
    assert block["dp"] == plan and SELECTION_CAVEAT in block["notes"]
    plain = evaluation_privacy(_dataset(), "evl_1", spec.model_copy(update={"dp": None}))
    assert plain["dp"] is None and SELECTION_CAVEAT in plain["notes"]
