"""The shared wording of problems (issue 15, item 3): clean per-field errors named once, and
budget refusals that say what the user can change."""

from __future__ import annotations

import random

import pytest
from dpsynth_shared.errors import (
    REFUSAL_EXCEEDS,
    REFUSAL_EXHAUSTED,
    REFUSAL_RESERVED,
    SMALLEST_TARGET,
    DpsynthError,
    ErrorCode,
    budget_refusal,
    budget_refusal_detail,
    error_from_problem,
    round_down,
)
from dpsynth_shared.field_errors import clean_message, field_errors, with_clean_field_errors
from dpsynth_shared.text import MIN_EPSILON
from pydantic import BaseModel, ValidationError, model_validator


class _Meta(BaseModel):
    holdout_fraction: float | None = None
    holdout_key: str | None = None

    @model_validator(mode="after")
    def _key(self) -> _Meta:
        if self.holdout_key is not None and self.holdout_fraction is None:
            raise ValueError("holdout_key is given only with holdout_fraction")
        return self


def test_pydantic_prefixes_and_urls_are_cleaned() -> None:
    with pytest.raises(ValidationError) as info:
        _Meta.model_validate({"holdout_key": "k"})
    (error,) = field_errors(info.value.errors())
    assert error == {"loc": [], "field": "", "msg": "holdout_key is given only with "
                     "holdout_fraction", "type": "value_error"}
    assert clean_message("Value error, x [For further information visit "
                         "https://errors.pydantic.dev/2.9/v/value_error]") == "x"
    assert clean_message("Assertion failed, y") == "y"


def test_field_paths_drop_the_body_and_the_union_tag() -> None:
    raw = [{"loc": ("body", "finetune", "privacy", "target_epsilon"), "msg": "m", "type": "t",
            "input": "private!"},
           {"loc": ("body",), "msg": "bad tag", "type": "union_tag_invalid"}]
    errors = field_errors(raw, tag="finetune")
    assert [e["field"] for e in errors] == ["privacy.target_epsilon", "type"]
    assert all("input" not in e for e in errors)  # never echo the input back


def test_a_detail_that_lists_its_errors_names_only_the_fields() -> None:
    err = DpsynthError(ErrorCode.INVALID_DATASET, "invalid metadata: on_overlap: Input should "
                       "be 'refuse' or 'link'; holdout_fraction: Input should be less than or "
                       "equal to 0.5", errors=[
                           {"loc": ["on_overlap"], "msg": "Input should be 'refuse' or 'link'"},
                           {"loc": ["holdout_fraction"],
                            "msg": "Input should be less than or equal to 0.5"}])
    clean = with_clean_field_errors(err)
    assert clean.detail == "invalid metadata (2 field errors: on_overlap, holdout_fraction)"
    assert [e["field"] for e in clean.extensions["errors"]] == ["on_overlap", "holdout_fraction"]
    assert with_clean_field_errors(clean) is clean  # idempotent
    plain = DpsynthError(ErrorCode.NOT_FOUND, "no such dataset")
    assert with_clean_field_errors(plain) is plain


@pytest.mark.parametrize(("value", "expected"), [(1.7599432502780967, 1.75), (3.19, 3.19),
                                                 (0.2516028517066321, 0.251),
                                                 (12.349, 12.3), (0.00045678, 0.000456)])
def test_round_down_to_three_digits(value: float, expected: float) -> None:
    assert round_down(value) == expected


def test_round_down_is_never_above_the_value() -> None:
    rng = random.Random(15)
    for _ in range(10_000):
        value = 10 ** rng.uniform(-4, 2)
        down = round_down(value)
        assert down <= value and down >= value * (1 - 1e-2)
    for exact in (1.0, 3.19, 0.25, 10.0, 0.001):
        assert round_down(exact) <= exact


def test_a_job_over_the_admissible_target_is_not_called_exhausted() -> None:
    numbers = {"refusal": REFUSAL_EXCEEDS, "target_epsilon": 8.0, "epsilon_limit": 2.0,
               "dataset_epsilon_spent": 0.0, "dataset_epsilon_reserved": 0.0,
               "suggested_target_epsilon": 1.75}
    detail = budget_refusal_detail(numbers, field="privacy.target_epsilon")
    assert detail.startswith("this job would need ε 8; at most 1.75 is admissible on this "
                             "dataset now (lower privacy.target_epsilon to ≤ 1.75)")
    assert "exhausted" not in detail
    err = DpsynthError(ErrorCode.PRIVACY_BUDGET_EXHAUSTED, detail, **numbers)
    problem = err.to_problem()
    assert problem.title == "Request exceeds the admissible privacy budget"
    assert problem.code == "privacy_budget_exhausted"
    # the title survives a hop through a problem body (ledger → api → client)
    again = error_from_problem(problem.model_dump(exclude_none=True))
    assert again.to_problem().title == problem.title


def test_the_other_refusals_say_why() -> None:
    base = {"target_epsilon": 1.0, "epsilon_limit": 2.0, "dataset_epsilon_spent": 2.0,
            "dataset_epsilon_reserved": 0.0}
    exhausted = budget_refusal_detail({**base, "refusal": REFUSAL_EXHAUSTED})
    assert exhausted.startswith("this dataset's privacy budget is exhausted")
    held = budget_refusal_detail({**base, "refusal": REFUSAL_RESERVED,
                                  "dataset_epsilon_spent": 0.5})
    assert "reserved by running jobs" in held and "exhausted" not in held
    busy = budget_refusal_detail({**base, "refusal": REFUSAL_EXCEEDS})
    assert "too busy to compute" in busy and "at most" not in busy  # no number made up
    assert "a dry run (dry_run) names it" in busy
    assert DpsynthError(ErrorCode.PRIVACY_BUDGET_EXHAUSTED, exhausted,
                        refusal=REFUSAL_EXHAUSTED).title == "Privacy budget exhausted"
    assert DpsynthError(ErrorCode.PRIVACY_BUDGET_EXHAUSTED, "x").title == \
        "Privacy budget exhausted"  # an older ledger's refusal: the old title


def test_an_advice_below_the_smallest_target_is_not_given() -> None:
    assert SMALLEST_TARGET == MIN_EPSILON
    tiny = budget_refusal({"target_epsilon": 1.0}, best=0.0009, held=True)
    assert tiny.extensions["refusal"] == REFUSAL_RESERVED
    assert tiny.extensions["suggested_target_epsilon"] is None
    fits = budget_refusal({"target_epsilon": 1.0}, best=0.0123456)
    assert fits.extensions["suggested_target_epsilon"] == 0.0123
    busy = budget_refusal({"target_epsilon": 1.0}, best=None, computed=False)
    assert busy.extensions["refusal"] == REFUSAL_EXCEEDS
