"""Fixtures for the ML core: a tiny digits dataset and a tiny pretrained model (16x16)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dpsynth_ml import PretrainTraining, TrainingResult, train

from .support import IMAGE_SIZE, write_digits

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def digits_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits(tmp_path_factory.mktemp("data") / "digits.npz")


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory: pytest.TempPathFactory, digits_path: Path) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=2, batch_size=25,
                            learning_rate=1e-3, seed=0)
    return train(spec, dataset_path=digits_path, out_dir=tmp_path_factory.mktemp("pretrain"))
