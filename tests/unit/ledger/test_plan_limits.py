"""Issue 14, item 1: the plan bounds are checked before any accounting (no database)."""

from __future__ import annotations

import time

import pytest
from dpsynth_ledger.accounting import calibrate_noise_multiplier
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.ledger_contract import LabelShape, PlanRequest
from dpsynth_shared.plan_limits import PlanLimits, check_plan_size


def _refusal(request: PlanRequest, limits: PlanLimits) -> dict[str, object]:
    with pytest.raises(DpsynthError) as caught:
        check_plan_size(request, limits)
    assert caught.value.status == 422 and caught.value.code == "plan_too_large"
    return caught.value.extensions


def test_each_bound_is_named_with_its_limit_and_the_plans_value() -> None:
    attack = PlanRequest(dataset_id="d", target_epsilon=1.0, expected_batch_size=1,
                         steps=10_000 * (2**31 - 1))
    assert _refusal(attack, PlanLimits()) == {"bound": "max_steps", "limit": 100_000,
                                              "value": 10_000 * (2**31 - 1)}
    classes = PlanRequest(dataset_id="d", target_epsilon=1.0, per_label={
        str(c): LabelShape(expected_batch_size=10, steps=60_000) for c in range(20)})
    assert _refusal(classes, PlanLimits()) == {"bound": "max_total_steps",
                                               "limit": 1_000_000, "value": 1_200_000}
    assert _refusal(classes, PlanLimits(max_runs=10))["bound"] == "max_runs"
    check_plan_size(PlanRequest(dataset_id="d", target_epsilon=1.0, expected_batch_size=2000,
                                steps=6_000), PlanLimits())  # DP-LDM's MNIST job: admissible


def test_the_accountant_refuses_an_unbounded_calibration_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match="no calibration beyond"):
        calibrate_noise_multiplier(1.0, 1 / (2**31 - 1), 10_000 * (2**31 - 1), 1e-10)
    assert time.monotonic() - start < 0.1
