"""A unit's contribution to the central-image release (:mod:`dpsynth_ml.warmup.release`):
its image preprocessed as the finetune does, block-averaged and centred; and the clip scale."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth_ml.data import images_to_tensor
from dpsynth_ml.spec import InvalidSpecError

CHUNK = 1024
"""Images converted at once."""


def pixels(images: np.ndarray, image_size: int | None, channels: int | None) -> torch.Tensor:
    """uint8 [n, H, W, C] → float64 [n, c, S, S] in [0, 1], preprocessed as the finetune does
    (resized to ``image_size``, channel-matched); exact /255 when nothing changes."""
    size = image_size if image_size is not None else int(images.shape[1])
    chans = channels if channels is not None else int(images.shape[3])
    if images.shape[1:] == (size, size, chans):
        x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
        return x.to(torch.float64) / 255.0
    x = images_to_tensor(images, image_size=size, channels=chans).to(torch.float64)
    return ((x + 1.0) / 2.0).clamp(0.0, 1.0)


def contributions(images: np.ndarray, downsample: int, image_size: int | None,
                   channels: int | None) -> torch.Tensor:
    """Centred block-averaged images, float64 [n, h·w·c] (channels last), in [-0.5, 0.5]."""
    x = pixels(images, image_size, channels)
    if downsample > 1:
        if x.shape[-1] % downsample:
            raise InvalidSpecError("central_images.downsample must divide the image size")
        x = F.avg_pool2d(x, downsample)
    return (x - 0.5).permute(0, 2, 3, 1).reshape(x.shape[0], -1)


def clip_scale(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """min(1, bound / norm) per row (1 for a zero norm)."""
    return torch.clamp(bound / norms.clamp_min(1e-300), max=1.0)


def query_rows(images: np.ndarray, labels: np.ndarray, subjects: np.ndarray | None, *,
               downsample: int, sample_mask: np.ndarray | None, image_size: int | None,
               channels: int | None) -> tuple[np.ndarray, int, int, int, int, np.ndarray]:
    """What a query sums: (int64 labels, image size, channels, downsampled side, dimension
    h·w·c, the indices of the images of the sampled units).

    Raises:
        InvalidSpecError: ``downsample`` does not divide the image size.
        ValueError: a record-level ``sample_mask`` of the wrong length.
    """
    labels = np.asarray(labels, dtype=np.int64)
    size = image_size if image_size is not None else int(images.shape[1])
    chans = channels if channels is not None else int(images.shape[3])
    if size % downsample:
        raise InvalidSpecError("central_images.downsample must divide the image size")
    side = size // downsample
    keep = np.ones(len(images), dtype=bool)
    if sample_mask is not None:
        mask = np.asarray(sample_mask, dtype=bool)
        if subjects is None and mask.shape[0] != len(images):
            raise ValueError("sample_mask must have one entry per unit")
        keep = mask[subjects] if subjects is not None else mask.copy()
    return labels, size, chans, side, side * side * chans, np.flatnonzero(keep)
