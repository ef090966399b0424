"""Downstream image classifiers that train well under DP-SGD (issue 20, item 1).

* ``cnn``: the evaluation library's CNN (``dpsynth_ml.evaluation.classifiers``), so a
  directly DP-trained model and a model trained on a synthetic corpus are the SAME network
  and their held-out accuracies compare like for like.
* ``gn_resnet``: a small residual network with GroupNorm in place of BatchNorm (BatchNorm
  mixes examples, so per-example gradients and their clipping would not be the unit's
  alone; opacus refuses it). Three stages of two basic blocks (16, 32, 64 channels; the
  second and third halve the resolution), global average pooling, one linear layer: the
  recipe of De et al. (2022, "Unlocking high-accuracy differentially private image
  classification through scale", GroupNorm + weight standardisation omitted) at a size a
  CPU trains. ScatterNet + linear (Tramèr & Boneh 2021) is not offered yet.

Every architecture takes images in [-1, 1] at ``image_size`` x ``image_size`` x
``channels`` (``Classifier.to_input``); the DP engine checks it with opacus' validator.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from dpsynth_ml.evaluation.classifiers import Classifier
from dpsynth_ml.spec import InvalidSpecError

ClassifierArchitecture = Literal["cnn", "gn_resnet"]
ARCHITECTURES: tuple[str, ...] = get_args(ClassifierArchitecture)
GROUPS = 8
"""GroupNorm groups per layer (every width below is a multiple of it)."""


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.GroupNorm(GROUPS, cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.GroupNorm(GROUPS, cout))
        self.skip: nn.Module = (nn.Identity() if stride == 1 and cin == cout else
                                nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride,
                                                        bias=False),
                                              nn.GroupNorm(GROUPS, cout)))
        self.out = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x) + self.skip(x))  # type: ignore[no-any-return]


class GroupNormResNet(nn.Module):
    """conv3x3(16)-GN-ReLU, 3 stages x 2 basic blocks (16, 32, 64), avg-pool, linear(K)."""

    def __init__(self, *, channels: int, num_classes: int,
                 widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(channels, widths[0], 3, padding=1, bias=False),
                                   nn.GroupNorm(GROUPS, widths[0]), nn.ReLU()]
        cin = widths[0]
        for i, width in enumerate(widths):
            layers += [_Block(cin, width, 1 if i == 0 else 2), _Block(width, width, 1)]
            cin = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


class DpClassifier(Classifier):
    """A :class:`~dpsynth_ml.evaluation.classifiers.Classifier` (its input format and its
    ``predict``/accuracy helpers) whose network is one of :data:`ARCHITECTURES`."""

    def __init__(self, architecture: str, *, image_size: int, channels: int,
                 num_classes: int) -> None:
        if architecture not in ARCHITECTURES:
            raise InvalidSpecError(f"unknown architecture {architecture!r}: one of "
                                   f"{', '.join(ARCHITECTURES)}")
        super().__init__("cnn", image_size=image_size, channels=channels,
                         num_classes=num_classes)
        self.kind = architecture
        if architecture == "gn_resnet":
            if image_size < 8:
                raise InvalidSpecError("gn_resnet needs images of at least 8x8")
            self.net = GroupNormResNet(channels=channels, num_classes=num_classes)


def build_classifier(architecture: str, *, image_size: int, channels: int,
                     num_classes: int, seed: int | None = None) -> DpClassifier:
    """A freshly initialised classifier (seeded when ``seed`` is given). Every architecture
    here has per-example gradients opacus computes (no BatchNorm); the DP engine validates
    the module again when it is built (``DpSgdEngine``: opacus' ``ModuleValidator``).

    Raises:
        InvalidSpecError: an unknown architecture or a size it cannot take.
    """
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = DpClassifier(architecture, image_size=image_size, channels=channels,
                                 num_classes=num_classes)
    else:
        model = DpClassifier(architecture, image_size=image_size, channels=channels,
                             num_classes=num_classes)
    return model
