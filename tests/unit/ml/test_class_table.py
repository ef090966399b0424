"""A finetune keeps the base model's class table when the base already has exactly the
dataset's classes, and starts a fresh one for new labels.

Found by the Fashion-MNIST table (issue 18): every finetune without a class_map used to
re-initialise the class table, so a DP (or non-private) finetune of a class-conditional
public model of the SAME label space threw away its class conditioning: on the designer's
slice, 64 near-noiseless DP-SGD steps took a public model's corpus from 58.5 % to 14.1 % CNN
accuracy, and to 67.2 % with the table kept (``.venv/bin/python -m
benchmarks.fmnist_designer_check class_table [--fresh-table]``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.data import load_dataset
from dpsynth_ml.models.architectures import ModelBundle
from dpsynth_ml.models.model_io import load_model, read_model_info
from dpsynth_ml.training.finetune import model_and_data

from .support import finetune_spec, seeded

pytestmark = pytest.mark.unit


def _table(bundle: ModelBundle) -> torch.Tensor:
    """The class table's weights, wherever the architecture keeps it."""
    from dpsynth_ml.models.architectures import ConditionalDenoiser
    from dpsynth_ml.models.trainable import embedder_parameter_name

    named = dict(ConditionalDenoiser(bundle.unet, bundle.class_embedder).named_parameters())
    return named[embedder_parameter_name(bundle.unet)].detach().clone()


def _renamed(digits_path: Path, tmp_path: Path) -> Path:
    with np.load(digits_path) as z:
        images, labels = z["images"], z["labels"]
    out = tmp_path / "renamed.npz"
    np.savez(out, images=images, labels=labels,
             class_names=np.array([f"letter {i}" for i in range(10)]))
    return out


def test_same_classes_keep_the_table_new_labels_get_a_fresh_one(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    spec = finetune_spec(trainable="full", class_map=None)
    bundle, info = load_model(pretrained.model_dir)
    before = _table(bundle)
    data = model_and_data(spec, bundle, info, load_dataset(digits_path),
                          pretrained.model_dir, fresh=True)
    assert data.info.extra["class_table"] == "kept"
    assert torch.equal(_table(bundle), before)

    bundle, info = load_model(pretrained.model_dir)
    data = model_and_data(spec, bundle, info, load_dataset(_renamed(digits_path, tmp_path)),
                          pretrained.model_dir, fresh=True)
    assert data.info.extra["class_table"] == "fresh"
    assert data.info.class_names[0] == "letter 0"
    assert not torch.equal(_table(bundle), before)


def test_a_finetuned_model_records_whether_it_kept_the_table(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    spec = finetune_spec(trainable="full", class_map=None, dp_steps=1)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    assert read_model_info(result.model_dir).extra["class_table"] == "kept"
