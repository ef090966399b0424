"""The job specs of issue 2 validate exactly as written; impossible specs are refused."""

from __future__ import annotations

import pytest
from dpsynth_shared.job_specs import FinetuneSpec, GenerateSpec, JobSpec, PretrainSpec, steps_for
from pydantic import TypeAdapter, ValidationError

SPECS = TypeAdapter(JobSpec)

ISSUE_SPECS = [
    {"type": "pretrain", "dataset_id": "ds_public", "preset": "small", "image_size": 32,
     "channels": 1, "class_conditional": True, "seed": 0},
    {"type": "finetune", "dataset_id": "ds_private", "base_model_id": "mdl_base",
     "privacy": {"target_epsilon": 4.0, "max_grad_norm": 1.0},
     "training": {"trainable": "attention", "expected_batch_size": 256, "epochs": 5,
                  "learning_rate": 0.0003, "class_conditional": True, "label_dropout": 0.1}},
    {"type": "generate", "model_id": "mdl_x", "samples_per_class": 100, "sampler": "ddim",
     "steps": 50, "guidance_scale": 2.0, "seed": 0},
]


@pytest.mark.parametrize("raw", ISSUE_SPECS, ids=lambda r: r["type"])
def test_issue_specs_validate(raw: dict) -> None:
    spec = SPECS.validate_python(raw)
    assert spec.type == raw["type"]
    assert isinstance(spec, {"pretrain": PretrainSpec, "finetune": FinetuneSpec,
                             "generate": GenerateSpec}[raw["type"]])


@pytest.mark.parametrize("privacy", [{"target_epsilon": 0}, {"target_epsilon": -1.0},
                                     {"target_epsilon": 4.0, "max_grad_norm": 0}])
def test_impossible_privacy_is_refused(privacy: dict) -> None:
    raw = {**ISSUE_SPECS[1], "privacy": privacy}
    with pytest.raises(ValidationError):
        SPECS.validate_python(raw)


def test_jobs_carry_no_delta() -> None:
    raw = {**ISSUE_SPECS[1], "privacy": {"target_epsilon": 4.0, "delta": 1e-5}}
    with pytest.raises(ValidationError):
        SPECS.validate_python(raw)


def test_unknown_type_and_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        SPECS.validate_python({"type": "train", "dataset_id": "x"})
    with pytest.raises(ValidationError):
        SPECS.validate_python({**ISSUE_SPECS[0], "learning_rat": 1e-3})


@pytest.mark.parametrize(("epochs", "batch", "n", "steps"),
                         [(5, 256, 60_000, 1172), (1, 100, 100, 1), (2.5, 10, 100, 25),
                          (0.01, 256, 1000, 1)])
def test_steps_are_ceil_of_epochs_times_n_over_batch(epochs: float, batch: int, n: int,
                                                      steps: int) -> None:
    assert steps_for(epochs=epochs, expected_batch_size=batch, declared_size=n) == steps
