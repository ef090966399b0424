"""Fixtures of the evaluation-library tests: sklearn's 8x8 digits (1797 images) and a
feature network trained on them for a few epochs (a few seconds on one core)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml.evaluation import FeatureNet, FeatureNetInfo, load_feature_net, train_feature_net

CLASS_NAMES = tuple(f"digit {i}" for i in range(10))


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> Iterator[None]:
    """These small models run fastest on one thread: on the shared 2-core machine, two
    threads spend most of their time waiting for each other (measured: 10x the CPU time)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass(frozen=True)
class Digits:
    images: np.ndarray  # uint8 [N, 8, 8, 1]
    labels: np.ndarray  # int64 [N]


@pytest.fixture(scope="session")
def digits() -> Digits:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    return Digits(images=images, labels=d.target.astype(np.int64))


@pytest.fixture(scope="session")
def featnet_dir(tmp_path_factory: pytest.TempPathFactory, digits: Digits) -> Path:
    """A feature network trained on the first 1200 digits (its own 20% validation split);
    digits 1200.. are never seen by it."""
    out = tmp_path_factory.mktemp("featnet")
    train_feature_net(digits.images[:1200], digits.labels[:1200], class_names=CLASS_NAMES,
                      image_size=8, channels=1, epochs=3, batch_size=64, learning_rate=3e-3,
                      seed=0, out_dir=out)
    return out


@pytest.fixture(scope="session")
def featnet(featnet_dir: Path) -> tuple[FeatureNet, FeatureNetInfo]:
    return load_feature_net(featnet_dir)
