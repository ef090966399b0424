"""Augmentation of the released central images during the warm-up (public post-processing).

DP-FETA trains on a handful of released images per class; random jitter keeps the warm-up
from memorising them. Per image: an integer shift of up to ±H/8 (replicate-pad, then crop),
a small affine warp (rotation ±10°, scale 0.9–1.1; ``affine_grid``/``grid_sample`` with
border padding), then contrast (×0.8–1.2 about the image mean) and brightness (±0.1)
jitter, clamped to [0, 1]. No flips: a flipped digit or letter is another glyph.

The randomness is an ordinary seeded torch generator: the inputs are public.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MAX_DEGREES = 10.0
SCALE_RANGE = (0.9, 1.1)
CONTRAST_RANGE = (0.8, 1.2)
MAX_BRIGHTNESS = 0.1


def _uniform(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=generator)


def random_shift(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift each image of [n, c, H, W] by up to ±H/8 pixels in each direction."""
    n, _, h, w = x.shape
    pad = max(h, w) // 8
    if pad == 0 or n == 0:
        return x
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator).tolist()
    return torch.stack([padded[i, :, dy:dy + h, dx:dx + w]
                        for i, (dy, dx) in enumerate(offsets)])


def random_affine(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Rotate each image by up to ±10° and scale it by 0.9–1.1 (bilinear, border padding)."""
    n = x.shape[0]
    if n == 0:
        return x
    angle = _uniform(n, -MAX_DEGREES, MAX_DEGREES, generator) * (math.pi / 180.0)
    # the grid maps output to input coordinates: dividing by s zooms the image by s
    inv_scale = 1.0 / _uniform(n, *SCALE_RANGE, generator)
    cos, sin = torch.cos(angle) * inv_scale, torch.sin(angle) * inv_scale
    zero = torch.zeros(n)
    theta = torch.stack([torch.stack([cos, -sin, zero], dim=1),
                         torch.stack([sin, cos, zero], dim=1)], dim=1).to(x.dtype)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def random_jitter(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Contrast ×0.8–1.2 about each image's mean and brightness ±0.1, clamped to [0, 1]."""
    n = x.shape[0]
    contrast = _uniform(n, *CONTRAST_RANGE, generator).to(x.device, x.dtype).view(n, 1, 1, 1)
    brightness = _uniform(n, -MAX_BRIGHTNESS, MAX_BRIGHTNESS, generator).to(
        x.device, x.dtype).view(n, 1, 1, 1)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return ((x - mean) * contrast + mean + brightness).clamp(0.0, 1.0)


def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift, affine warp and contrast/brightness jitter of images [n, c, H, W] in [0, 1]."""
    return random_jitter(random_affine(random_shift(x, generator), generator), generator)
