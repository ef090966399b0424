"""DP-FETA's "central images" warm-up (Li et al. 2025, arXiv 2504.01395) before DP-SGD.

:mod:`~dpsynth_ml.warmup.release` (the DP release of noisy class means, from each unit's
:mod:`~dpsynth_ml.warmup.contributions`; with :mod:`~dpsynth_ml.warmup.moments` the class
second moments too),
:mod:`~dpsynth_ml.warmup.augment` and :mod:`~dpsynth_ml.warmup.train` (the non-private
warm-up on the released images: post-processing), :mod:`~dpsynth_ml.warmup.store` (the
release on disk) and :mod:`~dpsynth_ml.warmup.stage` (how a finetune runs them).
"""

from __future__ import annotations

from dpsynth_ml.warmup.release import CentralRelease, class_sums, release_central_images

__all__ = ["CentralRelease", "class_sums", "release_central_images"]
