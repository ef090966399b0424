"""What a ``dp_train`` job of an image classifier runs (issue 20, item 1): the classifier,
the optimiser and the DP-SGD settings exactly as the ledger accounted them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dpsynth_ml.dp_train.models import ARCHITECTURES
from dpsynth_ml.spec import InvalidSpecError, RecordLevel, SubjectLevel

Optimizer = Literal["adam", "sgd"]


@dataclass(frozen=True)
class ClassifierTraining:
    """Direct DP training of a downstream image classifier on a private dataset.

    Attributes:
        architecture: ``cnn`` or ``gn_resnet`` (:mod:`dpsynth_ml.dp_train.models`).
        image_size, channels: the classifier's input (the dataset's images are resized and
            converted to it, as the evaluation's classifiers do).
        privacy: record-level DP-SGD (one clipped contribution per image) or user-level
            (one per subject, the mean of up to ``max_images_per_subject`` of its images),
            with the ledger's sigma, q, B, C and steps verbatim.
        optimizer: ``adam`` (DP-Adam: Adam on the privatised gradient, PrIeD-KIE's and
            DP-DocLDM's baseline) or ``sgd`` (with ``momentum``).
        learning_rate, momentum: of the optimiser.
        max_physical_batch_size: rows per micro-batch (memory only; the mechanism does
            not depend on it).
        checkpoint_every: steps per lease and per checkpoint.
    """

    architecture: str
    image_size: int
    channels: int
    privacy: RecordLevel | SubjectLevel
    optimizer: Optimizer = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.9
    max_physical_batch_size: int = 256
    checkpoint_every: int = 100

    kind = "dp_train_classifier"

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise InvalidSpecError(f"unknown architecture {self.architecture!r}: one of "
                                   f"{', '.join(ARCHITECTURES)}")
        if not 4 <= self.image_size <= 256 or self.channels not in (1, 3):
            raise InvalidSpecError("image_size must be in [4, 256] and channels 1 or 3")
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidSpecError("optimizer must be 'adam' or 'sgd'")
        if not (math.isfinite(self.learning_rate) and 0 < self.learning_rate <= 10):
            raise InvalidSpecError("learning_rate must be in (0, 10]")
        if not 0 <= self.momentum < 1:
            raise InvalidSpecError("momentum must be in [0, 1)")
        if self.max_physical_batch_size < 1 or self.checkpoint_every < 1:
            raise InvalidSpecError("max_physical_batch_size and checkpoint_every must be >= 1")
