"""What the report page draws besides the numbers: samples, closest pairs, ratios.

The runner fills it from the ML core's evaluation result. Real images travel here only when
the page may show them; the renderer checks the document's flags again anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ClosestPair:
    """A synthetic image and its nearest training image.

    Attributes:
        synthetic_index: index into ``ReportArrays.synthetic_images``.
        train_index: index into ``ReportArrays.train_images`` (None: not available).
        class_name: the synthetic image's class.
        space: ``pixel`` or ``features``.
        d_train: distance to the nearest training image.
        d_holdout: distance to the nearest held-out image.
        flagged: the memorisation check flagged it (ratio below threshold or exact copy).
    """

    synthetic_index: int
    train_index: int | None
    class_name: str
    space: str
    d_train: float
    d_holdout: float
    flagged: bool = False


@dataclass(frozen=True)
class ReportArrays:
    """Images and per-image figures for :func:`dpsynth_worker.reports.render_html`.

    Attributes:
        class_names: the label domain, in label order.
        synthetic_images: uint8 [N, H, W, C]; ``synthetic_labels`` int [N].
        real_images: real held-out images to show beside the synthetic grids (None: none).
        train_images: the training images the closest pairs point into (None: none).
        closest_pairs: the pairs to draw, closest first.
        ratios: memorisation space -> d_train / d_holdout per synthetic image.
        samples_per_class: images per class in the sample grids.
    """

    class_names: Sequence[str]
    synthetic_images: np.ndarray
    synthetic_labels: np.ndarray
    real_images: np.ndarray | None = None
    real_labels: np.ndarray | None = None
    train_images: np.ndarray | None = None
    closest_pairs: Sequence[ClosestPair] = ()
    ratios: Mapping[str, np.ndarray] = field(default_factory=dict)
    samples_per_class: int = 10
