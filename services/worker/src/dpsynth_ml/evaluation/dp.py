"""The DP part of an evaluation (issue 13, item 6; docs/privacy.md "DP evaluations").

For each downstream classifier trained on the SYNTHETIC corpus alone, the number of the
reference's held-out records it classifies correctly, over EVERY held-out record (never the
seeded ``max_images`` subsample: which records a subsample keeps depends on how many there
are, so one added record could change many terms). The classifier depends on the corpus
only (a DP output of the training part, or public), so adding or removing one held-out record
moves each count by at most 1: m counts have L2 sensitivity √m. The ledger calibrates σ for
that sensitivity and charges the release to the held-out partition; only then is the noise
drawn (:func:`release_accuracies`, from a generator the caller seeds from OS entropy), and
each released accuracy is (count + N(0, σ²)) / N̂_h with N̂_h a PUBLIC held-out size.

Nothing here logs: the counts are private until noised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from dpsynth_shared.secure_noise import NormalSource

from dpsynth_ml.evaluation.classifiers import Classifier, predict
from dpsynth_ml.evaluation.corpus import resize_uint8

_BATCH = 512


def holdout_correct_counts(classifiers: Mapping[str, Classifier], images: np.ndarray,
                           labels: np.ndarray) -> dict[str, int]:
    """Per classifier, how many of ALL the held-out records it classifies correctly.

    Args:
        classifiers: per kind, a classifier trained on synthetic images only.
        images: every held-out record, uint8 [N, H, W, C] (resized here, in batches, to each
            classifier's input exactly as the evaluation resized its sets).
        labels: int [N], indexing the classifiers' classes.
    """
    labels = np.asarray(labels).astype(np.int64)
    counts: dict[str, int] = {}
    for kind, model in classifiers.items():
        correct = 0
        for start in range(0, len(images), _BATCH):
            chunk = resize_uint8(images[start:start + _BATCH], image_size=model.image_size,
                                 channels=model.channels)
            correct += int((predict(model, chunk) == labels[start:start + _BATCH]).sum())
        counts[kind] = correct
    return counts


def release_accuracies(counts: Sequence[int], *, sigma: float, holdout_size: int,
                       rng: NormalSource) -> list[dict[str, Any]]:
    """Noise the counts (N(0, σ²) each, one draw per count) and normalise by N̂_h.

    Returns:
        per count: ``accuracy`` = (count + noise) / N̂_h as released (it may fall outside
        [0, 1]) and ``accuracy_clipped`` (the same clipped to [0, 1]: post-processing).
    """
    if holdout_size < 1 or sigma <= 0:
        raise ValueError("holdout_size must be >= 1 and sigma > 0")
    noisy = np.asarray(counts, dtype=np.float64) + rng.normal(0.0, sigma, len(counts))
    return [{"accuracy": float(v / holdout_size),
             "accuracy_clipped": float(min(1.0, max(0.0, v / holdout_size)))} for v in noisy]
