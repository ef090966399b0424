"""The agreed terms of the central-image release (dpsynth_shared.central_images): the public
bound of one unit's centred, downsampled contribution and the release's L2 sensitivity, in
closed form."""

from __future__ import annotations

import math

import pytest
from dpsynth_shared.central_images import (
    CentralImagesSpec,
    central_image_bound,
    central_image_sensitivity,
    downsampled_side,
)


@pytest.mark.parametrize(("size", "channels", "downsample", "bound"), [
    (28, 1, 2, 7.0),                     # MNIST, DP-FETA's 14x14: 0.5·√196
    (28, 1, 1, 14.0),                    # no downsampling: 0.5·28
    (32, 3, 2, 0.5 * math.sqrt(768)),    # CIFAR at 16x16x3
    (32, 3, 4, 0.5 * math.sqrt(192)),
    (64, 4, 8, 0.5 * math.sqrt(256)),
    (1, 1, 1, 0.5),
])
def test_the_bound_is_half_the_root_of_the_downsampled_dimension(
        size: int, channels: int, downsample: int, bound: float) -> None:
    assert central_image_bound(size, channels, downsample) == pytest.approx(bound, rel=1e-15)
    # every coordinate of a centred image lies in [-0.5, 0.5]: the all-±0.5 image attains it
    side = size // downsample
    corner = math.sqrt(side * side * channels * 0.25)
    assert central_image_bound(size, channels, downsample) == pytest.approx(corner, rel=1e-15)


def test_downsampling_must_divide_the_image() -> None:
    assert downsampled_side(28, 2) == 14 and downsampled_side(28, 7) == 4
    for size, downsample in ((28, 3), (28, 0), (5, 2)):
        with pytest.raises(ValueError, match="must divide"):
            central_image_bound(size, 1, downsample)


def test_the_sensitivity_is_the_bound_or_twice_it() -> None:
    bound = central_image_bound(28, 1, 2)
    assert central_image_sensitivity(bound, "add_remove") == 7.0
    assert central_image_sensitivity(bound, "replace_one") == 14.0
    # the Gaussian's RDP at the same noise: 4x under replace-one (α·Δ²/(2σ²))
    sigma, order = 3.0, 10
    ar = order * central_image_sensitivity(bound, "add_remove") ** 2 / (2 * sigma**2)
    ro = order * central_image_sensitivity(bound, "replace_one") ** 2 / (2 * sigma**2)
    assert ro == pytest.approx(4 * ar, rel=1e-15)


def test_several_queries_need_a_sample_rate() -> None:
    assert CentralImagesSpec(target_epsilon=1.0).queries == 1
    assert CentralImagesSpec(target_epsilon=1.0, sample_rate=0.1, queries=5).queries == 5
    with pytest.raises(ValueError, match="sample_rate"):
        CentralImagesSpec(target_epsilon=1.0, queries=5)
