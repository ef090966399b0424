"""The edge checks of ``dpsynth_shared.text`` and the contracts that use them (issue 14, item 4)."""

from __future__ import annotations

import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FinetuneSpec
from dpsynth_shared.ledger_contract import CreateBudget, PlanRequest
from dpsynth_shared.release_contract import HistogramRequest
from dpsynth_shared.text import refuse_bad_request_strings
from pydantic import ValidationError

BUDGET = {"dataset_id": "ds_" + "1" * 32, "tenant_id": "ten_x", "epsilon_limit": 8.0,
          "delta": 1e-6, "declared_size": 100}


@pytest.mark.parametrize("body", [
    {**BUDGET, "partitions": ["a", "b\x00"]},
    {**BUDGET, "partitions": ["a", "b\t"]},
    {**BUDGET, "tenant_id": "ten_\x00"},
    {**BUDGET, "tenant_id": "ten_\ud800"},
    {**BUDGET, "partitions": ["a", "b\udfff"]},
    {**BUDGET, "declared_size": 10**9 + 1},
])
def test_create_budget_refuses(body: dict) -> None:
    with pytest.raises(ValidationError):
        CreateBudget.model_validate(body)


def test_epsilons_below_the_minimum_are_refused() -> None:
    with pytest.raises(ValidationError):
        HistogramRequest.model_validate({"target_epsilon": 1e-323})
    with pytest.raises(ValidationError):
        PlanRequest.model_validate({"dataset_id": "ds_x", "target_epsilon": 1e-323,
                                    "expected_batch_size": 1, "steps": 1})
    assert HistogramRequest.model_validate({"target_epsilon": 1e-3}).target_epsilon == 1e-3


def test_a_nul_anywhere_in_a_job_spec_is_refused() -> None:
    spec = {"type": "finetune", "dataset_id": "ds_a", "base_model_id": "mdl_b",
            "privacy": {"target_epsilon": 1.0},
            "training": {"class_map": {"x\x00": "y"}}}
    with pytest.raises(ValidationError, match="NUL"):
        FinetuneSpec.model_validate(spec)


def test_a_lone_surrogate_anywhere_in_a_job_spec_is_refused() -> None:
    """JSON's "\\ud800" decodes to a str that no UTF-8 column can store (a 500 before)."""
    spec = {"type": "finetune", "dataset_id": "ds_\ud800", "base_model_id": "mdl_b",
            "privacy": {"target_epsilon": 1.0}}
    with pytest.raises(ValidationError, match="surrogate"):
        FinetuneSpec.model_validate(spec)
    with pytest.raises(DpsynthError):
        refuse_bad_request_strings({}, [("cursor", "a\udc80")])


def test_request_strings() -> None:
    refuse_bad_request_strings({"dataset_id": "ds_" + "a" * 32}, [("cursor", "abc")])
    with pytest.raises(DpsynthError) as exc:
        refuse_bad_request_strings({"dataset_id": "ds_\x00"}, [])
    assert exc.value.code == ErrorCode.NOT_FOUND
    with pytest.raises(DpsynthError) as exc:
        refuse_bad_request_strings({}, [("cursor", "a\x00")])
    assert exc.value.code == ErrorCode.INVALID_REQUEST
