"""The spec of a finetune's DP central-image release and warm-up (DP-FETA), a field of
:class:`dpsynth_ml.spec.FinetuneRecipe` (``central_images``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dpsynth_ml.errors import InvalidSpecError


@dataclass(frozen=True, kw_only=True)
class CentralImages:
    """A DP warm-up from released class means ("central images", DP-FETA), before DP-SGD.

    The release is one Gaussian mechanism over the vector of all class sums (docs/privacy.md,
    "Central images"; the terms are :mod:`dpsynth_shared.central_images`): each unit's
    contribution is its image block-averaged by ``downsample`` and centred (pixels in [0, 1]
    minus 0.5), a subject's images summed per class and the subject's whole contribution
    clipped once to ``bound``; N(0, ``noise_std``²) is added to every coordinate of every
    class sum and each sum divided by the PUBLIC class size (times ``sample_rate`` for a
    subsampled query), never the true count. The platform charges the release through
    :meth:`TrainingHooks.charge_release` before the noise is drawn; the noise comes from the
    secure source (:mod:`dpsynth_shared.secure_noise`). What follows (clamping, upsampling,
    the warm-up of the whole denoiser on the released images) is post-processing.

    Attributes:
        noise_std: std of the noise on each coordinate of each class sum (the ledger's
            calibration for the release's target epsilon).
        bound: public L2 bound of one unit's contribution (0.5·√(h·w·c) of the downsampled
            image; :func:`dpsynth_shared.central_images.central_image_bound`).
        class_sizes: public declared units per class name (N̂_c).
        downsample: block-average factor (it divides the image size).
        sample_rate: None for one query over every unit; else Poisson rate of each query.
        queries: number of subsampled queries (1 without ``sample_rate``).
        warmup_steps, warmup_batch_size, warmup_learning_rate: the non-private warm-up.
        warmup_ema_decay: the warm-up ends on an EMA of its weights (None: its last ones).
        augment: random shifts / affine / contrast jitter during the warm-up.
        second_moments: the release also carries each class's second moments (the sum of
            the same contributions' outer products, each unit's scaled by
            min(1, bound² / Σ‖u_i‖²), divided by ``bound``, upper triangle), with the same
            noise std: the unit norm is √2·bound, and the ledger's calibration (which set
            ``noise_std``) knows it. The warm-up then draws from each class's released
            Gaussian (the noisy mean plus ``components`` principal directions of the noisy
            covariance) instead of repeating the mean.
        components: principal directions per class sampled along (post-processing).
    """

    noise_std: float
    bound: float
    class_sizes: Mapping[str, int]
    downsample: int = 2
    sample_rate: float | None = None
    queries: int = 1
    warmup_steps: int = 500
    warmup_batch_size: int = 50
    warmup_learning_rate: float = 3e-4
    warmup_ema_decay: float | None = 0.995
    augment: bool = True
    second_moments: bool = False
    components: int = 16

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_std) and self.noise_std > 0):
            raise InvalidSpecError("central_images.noise_std must be finite and > 0")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise InvalidSpecError("central_images.bound must be finite and > 0")
        if not self.class_sizes or min(self.class_sizes.values()) < 1:
            raise InvalidSpecError("central_images needs a public size >= 1 for every class")
        if self.downsample < 1:
            raise InvalidSpecError("central_images.downsample must be >= 1")
        if self.sample_rate is not None and not 0.0 < self.sample_rate < 1.0:
            raise InvalidSpecError("central_images.sample_rate must be in (0, 1)")
        if self.queries < 1 or (self.sample_rate is None and self.queries != 1):
            raise InvalidSpecError("central_images.queries is 1 without a sample_rate")
        if min(self.warmup_steps, self.warmup_batch_size) < 1:
            raise InvalidSpecError("central_images warm-up steps and batch size must be >= 1")
        if self.warmup_ema_decay is not None and not 0.0 < self.warmup_ema_decay < 1.0:
            raise InvalidSpecError("central_images.warmup_ema_decay must be in (0, 1)")
        if self.components < 1:
            raise InvalidSpecError("central_images.components must be >= 1")
        if not (self.warmup_learning_rate > 0 and math.isfinite(self.warmup_learning_rate)):
            raise InvalidSpecError("central_images.warmup_learning_rate must be finite and > 0")
