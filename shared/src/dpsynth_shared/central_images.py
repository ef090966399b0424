"""The DP "central images" release (DP-FETA, Li et al. 2025, arXiv 2504.01395): shared terms.

A finetune may start with a DP warm-up that needs no public data: per class, the mean of the
private images (block-averaged ``downsample``× to cut the dimension), released once through
the Gaussian mechanism, then a short non-private warm-up of the denoiser on those released
images (post-processing) before DP-SGD. The api, the ledger and the ML core agree on the
terms below (docs/privacy.md, "Central images"):

* **Unit contribution and its public bound.** A unit's contribution to its class's sum is
  its image block-averaged by ``downsample`` and CENTRED (pixels in [0, 1] minus 0.5), so
  each coordinate lies in [-0.5, 0.5] and the L2 norm is at most
  :func:`central_image_bound` = 0.5·√(h·w·c) of the downsampled image. On a subject dataset
  a subject's centred images are summed per class and the subject's WHOLE contribution
  (all its classes together) is clipped once to that bound.
* **One mechanism over all classes.** The release is the vector of all class sums, each
  unit's contribution to it bounded by the bound above whatever its classes, plus
  N(0, σ²) per coordinate: ONE Gaussian mechanism of L2 sensitivity Δ = bound under
  add/remove and 2·bound under replace-one (the replaced unit's old and new contributions).
  It is charged once to every partition of the budget, so the charge does not depend on
  whether the labels are disjoint in the unit. (Per-class releases composed in parallel
  would charge each label partition the same amount, and an undeclared disjointness could
  not be relied on.)
* **Public normaliser.** Each noisy class sum is divided by the dataset's PUBLIC declared
  class size N̂_c (times q for a subsampled query), never the true count.
* **Queries.** ``sample_rate`` None: one query over every unit (a Gaussian event).
  Otherwise ``queries`` Poisson-subsampled queries at rate q, each a sum over the sampled
  units with the same bound and noise: exactly ``queries`` steps of the subsampled Gaussian
  mechanism, charged as a :class:`~dpsynth_shared.dp_events.DpSgdEvent` (add/remove; a
  replace-one dataset takes it through the ledger's group privacy like DP-SGD).
* **Second moments** (``second_moments``, FETA-Pro-style extra statistics). The release may
  also carry each class's sum of outer products u·uᵀ of the same contributions (the upper
  triangle, diagonal included), DIVIDED BY the bound B before the noise, with the same noise
  std on every coordinate. A unit's outer products are bounded jointly over all its classes:
  ‖Σ_i u_i·u_iᵀ‖_F ≤ Σ_i ‖u_i‖², so each unit's outer products are scaled by
  min(1, B² / Σ_i ‖u_i‖²) (a no-op for one record, whose ‖u‖ ≤ B). One unit then moves the
  scaled second-moment part by at most B in L2, and the joint vector (sums, second moments
  / B) by at most :func:`central_image_unit_norm` = √2·B: the sensitivity above times √2
  under either relation. The dimension h·w·c is capped at :data:`MAX_SECOND_MOMENT_DIM`
  (a d×d matrix per class).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpsynth_shared.text import MIN_EPSILON

MAX_QUERIES = 64
"""Most subsampled queries of one release (DP-FETA uses 5)."""
MAX_SECOND_MOMENT_DIM = 1024
"""Largest downsampled dimension h·w·c whose per-class second moments may be released (a
d×d matrix per class and query: 1024 is 8 MB per class in float64)."""
MAX_COMPONENTS = 256
"""Most principal directions per class the warm-up samples along."""


def downsampled_side(image_size: int, downsample: int) -> int:
    """Side of the released images: ``image_size`` block-averaged by ``downsample``.

    Raises:
        ValueError: ``downsample`` does not divide ``image_size``.
    """
    if downsample < 1 or image_size % downsample:
        raise ValueError(f"downsample {downsample} must divide image_size {image_size}")
    return image_size // downsample


def central_image_bound(image_size: int, channels: int, downsample: int) -> float:
    """Public L2 bound of one unit's centred, downsampled contribution: 0.5·√(h·w·c)."""
    side = downsampled_side(image_size, downsample)
    return 0.5 * math.sqrt(side * side * channels)


def central_image_unit_norm(bound: float, second_moments: bool = False) -> float:
    """L2 norm bound of one unit's whole released contribution: the bound B of its centred
    class sums, and with the second moments (each scaled by 1/B) √(B² + B²) = √2·B."""
    return math.sqrt(2.0) * bound if second_moments else bound


def central_image_sensitivity(bound: float, neighbouring: str, *,
                              second_moments: bool = False) -> float:
    """L2 sensitivity of the released vector: the unit norm
    (:func:`central_image_unit_norm`) under add/remove, twice it under replace-one (one unit's
    old contribution out, its new one in)."""
    unit = central_image_unit_norm(bound, second_moments)
    return unit if neighbouring == "add_remove" else 2.0 * unit


def second_moment_dim(image_size: int, channels: int, downsample: int) -> int:
    """d = h·w·c of the downsampled images, whose d×d second moments a release may carry."""
    side = downsampled_side(image_size, downsample)
    return side * side * channels


class CentralImagesSpec(BaseModel):
    """A finetune's DP central-image warm-up (job spec field ``training.central_images``)."""

    model_config = ConfigDict(extra="forbid")

    target_epsilon: float = Field(ge=MIN_EPSILON, le=100, description="the release's "
                                  "standalone epsilon at the dataset's delta; it is charged "
                                  "to the budget as its own event, before any noise is drawn, "
                                  "on top of the DP-SGD part (privacy.target_epsilon)")
    downsample: int = Field(2, ge=1, le=8, description="block-average the images by this "
                            "factor before the release (DP-FETA: 2, 28x28 -> 14x14): fewer "
                            "coordinates, less noise per pixel")
    sample_rate: float | None = Field(
        None, gt=0, lt=1, description="None: one query over every unit; else each of "
        "`queries` queries sums a Poisson sample of the units at this rate (DP-FETA: 0.1), "
        "giving `queries` noisy means per class instead of one")
    queries: int = Field(1, ge=1, le=MAX_QUERIES, description="subsampled queries (with "
                         "sample_rate only)")
    warmup_steps: int = Field(500, ge=1, le=1_000_000, description="non-private steps of "
                              "the whole denoiser on the released images (post-processing)")
    warmup_batch_size: int = Field(50, ge=1, le=4096)
    warmup_learning_rate: float = Field(3e-4, gt=0, le=1)
    warmup_ema_decay: float | None = Field(
        0.995, ge=0.5, lt=1, description="the warm-up ends on an exponential moving average "
        "of its weights (decay ramped up as min(decay, (1+t)/(10+t))); None: its last "
        "weights. Chosen on a designer slice of Fashion-MNIST disjoint from the private and "
        "test sets (docs/training-settings.md)")
    augment: bool = Field(True, description="random shifts, small affine jitter and "
                          "contrast jitter of the released images during the warm-up")
    second_moments: bool = Field(
        False, description="also release each class's second moments (sum of outer "
        "products of the same centred, downsampled contributions) in the same Gaussian "
        "mechanism: its sensitivity grows by sqrt(2), so the same target_epsilon adds sqrt(2) "
        "times the noise std; the warm-up then samples each class's released Gaussian (mean "
        "plus `components` principal directions) instead of its mean alone. At most "
        f"{MAX_SECOND_MOMENT_DIM} downsampled coordinates (h*w*c)")
    components: int = Field(16, ge=1, le=MAX_COMPONENTS, description="with "
                            "second_moments: principal directions of each class's released "
                            "covariance the warm-up samples along (post-processing)")

    @model_validator(mode="after")
    def _queries_need_sampling(self) -> CentralImagesSpec:
        if self.sample_rate is None and self.queries != 1:
            raise ValueError("several queries need a sample_rate: repeating a full-data "
                             "query only averages its noise (ask for one query with a "
                             "larger target_epsilon instead)")
        return self
