"""Specs of layout generators: ``target: masks`` on training jobs, ``model_id`` layouts."""

from __future__ import annotations

import pytest
from dpsynth_shared.job_specs import FinetuneTraining, GenerateSpec, LayoutSource, PretrainSpec
from pydantic import ValidationError


def test_target_defaults_to_images() -> None:
    assert PretrainSpec(dataset_id="ds_x").target == "images"
    assert FinetuneTraining().target == "images"


def test_a_mask_pretrain_is_grayscale_and_not_layout_conditioned() -> None:
    assert PretrainSpec(dataset_id="ds_x", target="masks").target == "masks"
    with pytest.raises(ValidationError, match="layout generator"):
        PretrainSpec(dataset_id="ds_x", target="masks", layout_conditioning=True)
    with pytest.raises(ValidationError, match="layout generator"):
        PretrainSpec(dataset_id="ds_x", target="masks", channels=3)


def test_a_mask_finetune_is_not_per_label() -> None:
    assert FinetuneTraining(target="masks").target == "masks"
    with pytest.raises(ValidationError, match="per_label"):
        FinetuneTraining(target="masks", per_label=True)


def test_a_layout_source_names_exactly_one_source() -> None:
    assert LayoutSource(model_id="mdl_x").dataset_id is None
    assert LayoutSource(dataset_id="ds_x").model_id is None
    with pytest.raises(ValidationError, match="exactly one"):
        LayoutSource()
    with pytest.raises(ValidationError, match="exactly one"):
        LayoutSource(dataset_id="ds_x", model_id="mdl_x")
    spec = GenerateSpec(model_id="mdl_a", layout_source={"model_id": "mdl_b"})
    assert spec.layout_source is not None and spec.layout_source.model_id == "mdl_b"
