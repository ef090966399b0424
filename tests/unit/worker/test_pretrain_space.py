"""A pretrain job's ``space`` reaches the ML core (issue 18, item 2): the worker's one
mapping (``dpsynth_worker.runners.training_specs.pretrain_training_spec``) hands it to
``PretrainTraining``, and the platform's pixel limit is the core's."""

from __future__ import annotations

import dataclasses
from typing import Any

import dpsynth_ml
import pytest
from dpsynth_shared.job_specs import MAX_PIXEL_IMAGE_SIZE, PretrainSpec
from dpsynth_shared.worker_contract import DatasetInfo
from dpsynth_worker.runners.training_specs import pretrain_training_spec

from tests.unit.worker.conftest import CLASS_NAMES

PUBLIC = DatasetInfo(dataset_id="ds_pub", visibility="public", object_key="k",
                     class_names=CLASS_NAMES)


def _built(**spec: Any) -> Any:
    return pretrain_training_spec(PretrainSpec(dataset_id="ds_pub", **spec), PUBLIC)


def test_pretrain_training_has_a_space() -> None:
    """The interface the mapping is written against: ``PretrainTraining.space``."""
    fields = {f.name: f for f in dataclasses.fields(dpsynth_ml.PretrainTraining)}
    assert "space" in fields and fields["space"].default == "latent"


@pytest.mark.parametrize("space", ["latent", "pixel"])
def test_the_job_specs_space_reaches_pretrain_training(space: str) -> None:
    built = _built(preset="tiny", space=space, image_size=32, channels=3, epochs=2)
    assert isinstance(built, dpsynth_ml.PretrainTraining)
    assert built.space == space
    assert (built.preset, built.image_size, built.channels, built.epochs) == ("tiny", 32, 3, 2)
    assert built.num_classes == len(CLASS_NAMES)


def test_a_spec_without_space_pretrains_in_latent_space() -> None:
    assert _built(preset="tiny").space == "latent"


def test_a_custom_pixel_architecture_reaches_the_core_without_a_vae() -> None:
    built = _built(preset="custom", space="pixel", image_size=16,
                   architecture={"unet_class": "UNet2DModel",
                                 "unet": {"block_out_channels": [16, 32]}})
    assert built.space == "pixel" and built.architecture is not None
    assert built.architecture.unet_class == "UNet2DModel" and not built.architecture.vae


def test_the_pixel_limit_is_the_ml_cores() -> None:
    """The job spec refuses what the core would refuse, at submission rather than on a
    worker: both sides name the same largest pixel-space image."""
    from dpsynth_ml.spec import MAX_PIXEL_IMAGE_SIZE as CORE_MAX

    assert MAX_PIXEL_IMAGE_SIZE == CORE_MAX
    assert _built(preset="tiny", space="pixel", image_size=MAX_PIXEL_IMAGE_SIZE).space == "pixel"
