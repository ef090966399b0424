"""The feature network: training writes a verifiable folder, a trained network passes the
accuracy check and a random one fails it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml.evaluation import (
    FEATURE_ARCHITECTURE,
    FeatureNet,
    FeatureNetInfo,
    FeatureNetworkRejected,
    check_feature_net,
    extract_features,
    feature_net_accuracy,
    load_feature_net,
    train_feature_net,
)
from dpsynth_ml.evaluation.featnet import INFO_FILE, WEIGHTS_FILE, file_sha256
from dpsynth_ml.spec import MlError

from .conftest import CLASS_NAMES, Digits

pytestmark = pytest.mark.unit


def test_trained_network_passes_the_check(featnet: tuple[FeatureNet, FeatureNetInfo],
                                          digits: Digits) -> None:
    net, info = featnet
    assert info.architecture == FEATURE_ARCHITECTURE
    assert info.validation_size == 240 and info.train_size == 960
    accuracy = check_feature_net(net, info, digits.images[1200:], digits.labels[1200:],
                                 min_accuracy=0.5)
    assert accuracy >= 0.8
    assert info.accuracy >= 0.8


def test_random_network_is_rejected(featnet: tuple[FeatureNet, FeatureNetInfo],
                                    digits: Digits) -> None:
    _, info = featnet
    torch.manual_seed(123)
    random_net = FeatureNet(channels=1, num_classes=10).eval()
    with pytest.raises(FeatureNetworkRejected) as caught:
        check_feature_net(random_net, info, digits.images[1200:], digits.labels[1200:],
                          min_accuracy=0.5)
    assert isinstance(caught.value, MlError)
    assert caught.value.code == "feature_network_rejected"
    assert caught.value.accuracy is not None and caught.value.accuracy < 0.5
    assert caught.value.threshold == 0.5


def test_threshold_is_at_least_twice_chance(featnet: tuple[FeatureNet, FeatureNetInfo],
                                            digits: Digits) -> None:
    net, info = featnet
    accuracy = feature_net_accuracy(net, info, digits.images[1200:], digits.labels[1200:])
    with pytest.raises(FeatureNetworkRejected):
        check_feature_net(net, info, digits.images[1200:], digits.labels[1200:],
                          min_accuracy=min(1.0, accuracy + 0.01))


def test_roundtrip_keeps_sha256_and_features(featnet_dir: Path, tmp_path: Path,
                                             digits: Digits) -> None:
    net, info = load_feature_net(featnet_dir)
    assert file_sha256(featnet_dir / WEIGHTS_FILE) == info.sha256
    assert FeatureNetInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
    copy = tmp_path / "copy"
    shutil.copytree(featnet_dir, copy)
    net2, info2 = load_feature_net(copy)
    assert info2.sha256 == info.sha256
    f1 = extract_features(net, info, digits.images[:50])
    f2 = extract_features(net2, info2, digits.images[:50])
    assert f1.dtype == np.float64 and f1.shape == (50, info.feature_dim)
    np.testing.assert_array_equal(f1, f2)


def test_training_is_deterministic(tmp_path: Path, digits: Digits) -> None:
    def run(seed: int, out: str) -> FeatureNetInfo:
        return train_feature_net(digits.images[:150], digits.labels[:150],
                                 class_names=CLASS_NAMES, image_size=8, channels=1, epochs=1,
                                 batch_size=32, learning_rate=3e-3, seed=seed,
                                 out_dir=tmp_path / out)

    first = run(0, "a")
    assert run(0, "b").sha256 == first.sha256
    assert run(1, "c").sha256 != first.sha256
    recorded = json.loads((tmp_path / "a" / INFO_FILE).read_text())
    assert recorded["sha256"] == first.sha256


def test_tampered_weights_are_rejected(featnet_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(featnet_dir, copy)
    data = bytearray((copy / WEIGHTS_FILE).read_bytes())
    data[-1] ^= 0xFF
    (copy / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(FeatureNetworkRejected):
        load_feature_net(copy)


def test_explicit_validation_set_and_progress(tmp_path: Path, digits: Digits) -> None:
    calls: list[tuple[int, int]] = []
    info = train_feature_net(digits.images[:100], digits.labels[:100], class_names=CLASS_NAMES,
                             image_size=12, channels=3, epochs=2, batch_size=50,
                             learning_rate=1e-3, seed=1, out_dir=tmp_path,
                             val_images=digits.images[200:260],
                             val_labels=digits.labels[200:260],
                             progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 2), (2, 2)]
    assert info.validation_size == 60 and info.train_size == 100
    net, loaded = load_feature_net(tmp_path)
    assert loaded == info
    assert extract_features(net, loaded, digits.images[:3]).shape == (3, 128)
