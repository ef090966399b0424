"""The FID InceptionV3 definition: builds, runs, has pytorch-fid's state-dict layout, and
load_inception refuses anything but the pinned file.

test_inception_reference.py compares the definition with pytorch-fid's own code under
identical random weights. Not checked anywhere (no network access to fetch the 95 MB weights
file): that the real ``pt_inception-2015-12-05-6726825d.pth`` loads and reproduces
pytorch-fid's reference values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml.evaluation.errors import InceptionWeightsUnavailable
from dpsynth_ml.evaluation.inception import (
    INCEPTION_SHA256,
    FIDInceptionV3,
    file_sha256,
    inception_features,
    load_inception,
)
from dpsynth_ml.spec import MlError

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model() -> FIDInceptionV3:
    torch.manual_seed(0)
    return FIDInceptionV3().eval()


def test_state_dict_layout(model: FIDInceptionV3) -> None:
    state = model.state_dict()
    # 94 BasicConv2d (conv weight + 5 BatchNorm tensors each) and fc weight + bias
    assert len(state) == 94 * 6 + 2
    shapes = {
        "Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3),
        "Conv2d_1a_3x3.bn.running_var": (32,),
        "Conv2d_4a_3x3.conv.weight": (192, 80, 3, 3),
        "Mixed_5b.branch_pool.conv.weight": (32, 192, 1, 1),
        "Mixed_5d.branch5x5_2.conv.weight": (64, 48, 5, 5),
        "Mixed_6a.branch3x3.conv.weight": (384, 288, 3, 3),
        "Mixed_6b.branch7x7_2.conv.weight": (128, 128, 1, 7),
        "Mixed_6e.branch7x7dbl_5.conv.weight": (192, 192, 1, 7),
        "Mixed_7a.branch7x7x3_4.conv.weight": (192, 192, 3, 3),
        "Mixed_7b.branch3x3_2b.conv.weight": (384, 384, 3, 1),
        "Mixed_7c.branch3x3dbl_1.conv.weight": (448, 2048, 1, 1),
        "Mixed_7c.branch_pool.bn.weight": (192,),
        "fc.weight": (1008, 2048),
        "fc.bias": (1008,),
    }
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    assert not any(k.startswith("AuxLogits") for k in state)
    assert all(m.eps == 0.001 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    # torchvision documents 27,161,264 parameters for Inception3 with its aux head
    # (3,326,696) and 1000 classes; without the aux head and with 1008 classes:
    assert sum(p.numel() for p in model.parameters()) == 27_161_264 - 3_326_696 + 8 * 2049


def test_forward_gives_pool_features(model: FIDInceptionV3) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(2, 8, 8, 1), dtype=np.uint8)
    features = inception_features(model, images)
    assert features.shape == (2, 2048) and features.dtype == np.float64
    assert np.isfinite(features).all() and (features >= 0).all()  # mean of ReLU outputs


def test_load_checks_the_pinned_sha256(model: FIDInceptionV3, tmp_path: Path) -> None:
    with pytest.raises(InceptionWeightsUnavailable) as missing:
        load_inception(tmp_path / "absent.pth")
    assert isinstance(missing.value, MlError)
    assert missing.value.code == "inception_weights_unavailable"
    path = tmp_path / "random.pth"
    torch.save(model.state_dict(), path)
    with pytest.raises(InceptionWeightsUnavailable, match="sha256"):
        load_inception(path)
    assert INCEPTION_SHA256.startswith("6726825d")
    # the loading path itself (weights_only + strict) with the file's own digest
    loaded = load_inception(path, sha256=file_sha256(path))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    wrong = tmp_path / "wrong.pth"
    torch.save({"fc.weight": torch.zeros(3)}, wrong)
    with pytest.raises(InceptionWeightsUnavailable, match="cannot load"):
        load_inception(wrong, sha256=file_sha256(wrong))
