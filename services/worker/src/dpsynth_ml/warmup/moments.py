"""The second moments of a central-image release (``second_moments``): each class's sum of
outer products of the units' contributions, bounded per unit; their noisy release; and the
post-processing into principal directions the warm-up samples along. Terms:
:mod:`dpsynth_shared.central_images` (docs/privacy.md, "Central images")."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch

from dpsynth_ml.warmup.contributions import CHUNK, clip_scale, contributions, query_rows


class NormalDraws(Protocol):
    """The shape of :class:`~dpsynth_shared.secure_noise.SecureNormal` (production) and of a
    seeded ``numpy.random.Generator`` (tests): N(loc, scale²) draws, float64."""

    def normal(self, loc: float = ..., scale: float = ..., size: int | None = ...,
               ) -> np.ndarray:
        ...


def class_second_moments(images: np.ndarray, labels: np.ndarray, subjects: np.ndarray | None,
                         *, downsample: int, bound: float, num_classes: int,
                         sample_mask: np.ndarray | None = None, image_size: int | None = None,
                         channels: int | None = None) -> np.ndarray:
    """Per class, the sum of every unit's outer products u·uᵀ of its contributions (no noise:
    private), each unit's scaled by min(1, bound² / Σ_i ‖u_i‖²) over ALL its images, so a
    unit's outer products over all its classes have Frobenius norm at most bound²
    (‖Σ_i u_i·u_iᵀ‖_F ≤ Σ_i ‖u_i‖²). A record-level unit's u is clipped to ``bound`` first
    (as in :func:`class_sums`), so its scale is 1.

    Args: as :func:`dpsynth_ml.warmup.release.class_sums`.

    Returns:
        float64 [C, d, d], d = h·w·c (channels last, as the sums' flattening).
    """
    labels, size, chans, _side, dim, rows = query_rows(
        images, labels, subjects, downsample=downsample, sample_mask=sample_mask,
        image_size=image_size, channels=channels)
    weights = torch.ones(len(images), dtype=torch.float64)
    if subjects is not None and len(rows):
        subject_ids = torch.from_numpy(np.asarray(subjects, dtype=np.int64))
        norm2 = torch.zeros(len(images), dtype=torch.float64)
        for start in range(0, len(rows), CHUNK):
            idx = rows[start:start + CHUNK]
            norm2[torch.from_numpy(idx)] = contributions(
                images[idx], downsample, size, chans).pow(2).sum(dim=1)
        per_subject = torch.zeros(int(subject_ids.max()) + 1, dtype=torch.float64).index_add_(
            0, subject_ids[torch.from_numpy(rows)], norm2[torch.from_numpy(rows)])
        weights = torch.clamp(bound * bound / per_subject.clamp_min(1e-300),
                              max=1.0)[subject_ids]
    moments = torch.zeros(num_classes, dim, dim, dtype=torch.float64)
    for start in range(0, len(rows), CHUNK):
        idx = rows[start:start + CHUNK]
        x = contributions(images[idx], downsample, size, chans)
        if subjects is None:
            x = x * clip_scale(x.norm(dim=1), bound)[:, None]
        x = x * weights[torch.from_numpy(idx)].sqrt()[:, None]
        chunk_labels = labels[idx]
        for c in np.unique(chunk_labels):
            xc = x[torch.from_numpy(chunk_labels == c)]
            moments[int(c)] += xc.T @ xc
    return moments.numpy()


def released_components(moments: np.ndarray, means: np.ndarray, *, bound: float,
                        normaliser: np.ndarray, components: int) -> np.ndarray:
    """Post-processing of the noisy scaled second moments of one query.

    Args:
        moments: float64 [C, d, d], the noisy (symmetric) second moments divided by ``bound``.
        means: float64 [C, d], the released (centred) class means of the same query.
        bound: the unit bound (undoes the 1/bound scaling).
        normaliser: float64 [C], the public divisor of each class (N̂_c, times q).
        components: k, the principal directions kept per class.

    Returns:
        float32 [C, k, d]: the top-k eigenvectors of each class's covariance
        bound·moments/N̂_c − μ·μᵀ, scaled by √max(λ, 0) (a negative eigenvalue, which noise
        can produce, gives a zero direction).
    """
    num_classes, dim, _ = moments.shape
    k = min(components, dim)
    out = np.zeros((num_classes, k, dim), dtype=np.float32)
    for c in range(num_classes):
        cov = bound * moments[c] / normaliser[c] - np.outer(means[c], means[c])
        values, vectors = np.linalg.eigh((cov + cov.T) / 2.0)
        top = np.argsort(values)[::-1][:k]
        scale = np.sqrt(np.clip(values[top], 0.0, None))
        out[c] = (vectors[:, top] * scale[None, :]).T.astype(np.float32)
    return out


def noisy_symmetric(moments: np.ndarray, bound: float, noise_std: float,
                     normal_source: NormalDraws) -> np.ndarray:
    """The DP output of the second moments: the upper triangle of ``moments / bound`` (the
    diagonal as is, each off-diagonal coordinate × √2, so the vector's L2 norm equals the
    matrix's Frobenius norm) plus N(0, noise_std²) per coordinate, mapped back (÷ √2 off the
    diagonal) and mirrored."""
    dim = moments.shape[1]
    iu = np.triu_indices(dim)
    weight = np.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))
    upper = moments[:, iu[0], iu[1]] / bound * weight
    upper = upper + np.asarray(normal_source.normal(0.0, noise_std, upper.size),
                               dtype=np.float64).reshape(upper.shape)
    upper = upper / weight
    out = np.zeros_like(moments)
    out[:, iu[0], iu[1]] = upper
    out[:, iu[1], iu[0]] = upper
    return out
