"""The DP release of the "central images" (DP-FETA, Li et al. 2025, arXiv 2504.01395).

Terms (docs/privacy.md, "Central images"; :mod:`dpsynth_shared.central_images`):

* a unit's contribution is its image resized to the model's size and channels (as the
  finetune preprocesses it), in [0, 1], block-averaged by ``downsample`` and CENTRED (minus
  0.5), so every coordinate is in [-0.5, 0.5] and its L2 norm is at most the public bound
  0.5·√(h·w·c). A unit is an image (record level) or a subject (a dataset with subjects):
  a subject's centred images are summed per class and its WHOLE contribution (all its
  classes together, a [C, h, w, c] vector) clipped once to ``bound``. Record-level
  contributions are clipped too, defensively (a no-op at the public bound);
* the release is the vector of all class sums plus N(0, ``noise_std``²) on every
  coordinate, drawn from the secure source (:class:`dpsynth_shared.secure_noise.SecureNormal`
  in production), AFTER :meth:`TrainingHooks.charge_release` accepted the charge;
* each noisy class sum is divided by the PUBLIC class size N̂_c (times ``sample_rate`` for a
  Poisson-subsampled query), never the true count;
* with ``second_moments``, the same query also releases each class's sum of outer products
  (:func:`class_second_moments`; each unit's bounded jointly over its classes by bound²),
  divided by the bound, upper triangle (off-diagonal × √2, so its norm is the Frobenius
  norm) plus N(0, ``noise_std``²) per coordinate: the joint
  vector's unit norm is √2·bound, which the ledger's calibration of ``noise_std`` used;
* ``queries`` subsampled queries sample the units (subjects when the dataset has them) with
  fresh OS randomness each.

Post-processing (public): the released covariance's top principal directions per class
(:func:`released_components`; the warm-up draws Gaussian images from them,
:func:`sample_released`); + 0.5, clamp to [0, 1], bilinear upsampling to the model's image
size, a 3×3 median blur (removes the isolated noise spikes) and a mild sharpen (unsharp
mask, amount :data:`SHARPEN`, against the blur of upsampling), clamped to [0, 1] again.

Nothing here logs: the class sums are private until noised.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth_ml.data import ImageDataset
from dpsynth_ml.spec import CentralImages, InvalidSpecError
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.warmup.contributions import CHUNK, clip_scale, contributions, query_rows
from dpsynth_ml.warmup.moments import (
    NormalDraws,
    class_second_moments,
    noisy_symmetric,
    released_components,
)

_BITS = 53
SHARPEN = 0.5
"""Unsharp-mask amount of the post-processing (x + a·(x − box3(x)))."""

UniformSource = Callable[[int], np.ndarray]
"""``n`` → float64 [n] uniforms in [0, 1) (Poisson subsampling of the units)."""


def secure_uniforms(count: int) -> np.ndarray:
    """``count`` uniforms in (0, 1] from the OS CSPRNG: 53 random bits ``k`` each, ``(k + 1) ·
    2^-53`` (the construction of :mod:`dpsynth_shared.secure_noise`)."""
    raw = np.frombuffer(secrets.token_bytes(8 * count), dtype="<u8") >> np.uint64(64 - _BITS)
    return (raw.astype(np.float64) + 1.0) * 2.0 ** -_BITS


@dataclass(frozen=True)
class CentralRelease:
    """What a release made public.

    Attributes:
        images: float32 [queries·C, H, W, c] in [0, 1], query-major (query 0's classes in
            dataset class order, then query 1's, ...), post-processed.
        labels: int64 [queries·C], the model class of each image (``class_index``).
        means: float64 [queries, C, h, w, c]: each noisy class sum divided by its public
            normaliser, before the + 0.5 and any post-processing (the DP output itself).
        components: with second moments, float32 [queries·C, k, h, w, c]: the top k
            principal directions of each released class covariance, each scaled by the
            square root of its (positive) eigenvalue, so ``means + Σ_j z_j·components[j]``
            with z ~ N(0, I) draws from the released Gaussian (post-processing); else None.
    """

    images: np.ndarray
    labels: np.ndarray
    means: np.ndarray
    components: np.ndarray | None = None


def class_sums(images: np.ndarray, labels: np.ndarray, subjects: np.ndarray | None, *,
               downsample: int, bound: float, num_classes: int,
               sample_mask: np.ndarray | None = None, image_size: int | None = None,
               channels: int | None = None) -> np.ndarray:
    """The sum of every unit's clipped contribution per class (no noise: private).

    Args:
        images: uint8 [N, H, W, C].
        labels: int [N] in [0, num_classes).
        subjects: int [N] dense subject indices, or None (each image is a unit).
        downsample: block-average factor (divides the image size).
        bound: L2 bound of one unit's whole contribution (over all its classes).
        num_classes: C.
        sample_mask: bool over the UNITS (subjects when ``subjects`` is given, else images):
            which units the query sums; None: all.
        image_size, channels: preprocess as the model sees the images (None: as stored).

    Returns:
        float64 [C, h, w, c].
    """
    labels, size, chans, side, dim, rows = query_rows(
        images, labels, subjects, downsample=downsample, sample_mask=sample_mask,
        image_size=image_size, channels=channels)
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    if subjects is None:
        for start in range(0, len(rows), CHUNK):
            idx = rows[start:start + CHUNK]
            x = contributions(images[idx], downsample, size, chans)
            x = x * clip_scale(x.norm(dim=1), bound)[:, None]
            sums.index_add_(0, torch.from_numpy(labels[idx]), x)
        return sums.reshape(num_classes, side, side, chans).numpy()
    # one row per (subject, class) the query touches; the subject is clipped over its rows
    subject_ids = np.asarray(subjects, dtype=np.int64)
    keys = subject_ids[rows] * num_classes + labels[rows]
    unique, inverse = np.unique(keys, return_inverse=True)
    key_sums = torch.zeros(len(unique), dim, dtype=torch.float64)
    inverse_t = torch.from_numpy(inverse.reshape(-1).astype(np.int64))
    for start in range(0, len(rows), CHUNK):
        idx = rows[start:start + CHUNK]
        key_sums.index_add_(0, inverse_t[start:start + CHUNK],
                            contributions(images[idx], downsample, size, chans))
    key_subject = torch.from_numpy(unique // num_classes)
    key_class = torch.from_numpy(unique % num_classes)
    num_subjects = int(subject_ids.max()) + 1 if subject_ids.size else 0
    norm2 = torch.zeros(num_subjects, dtype=torch.float64).index_add_(
        0, key_subject, key_sums.pow(2).sum(dim=1))
    scale = clip_scale(norm2.sqrt(), bound)
    sums.index_add_(0, key_class, key_sums * scale[key_subject][:, None])
    return sums.reshape(num_classes, side, side, chans).numpy()


def sample_released(release: CentralRelease, index: torch.Tensor, generator: torch.Generator,
                    *, image_size: int) -> torch.Tensor:
    """Images [n, c, S, S] in [0, 1] for released entries ``index``: the released image
    itself, or with second moments a fresh draw from the entry's released Gaussian (mean +
    Σ_j z_j·component_j, post-processed as the means are). On the CPU; the warm-up uses
    :class:`ReleasedBatches`, the same draws on its device."""
    return ReleasedBatches(release, image_size=image_size)(index, generator)


class ReleasedBatches:
    """Warm-up batches drawn where the denoiser trains: the released means and components
    are copied to ``device`` once, so each step moves only the batch's indices and its
    n·k standard normals (drawn from the CPU ``generator``, so the draws do not depend on
    the device) and draws, post-processes and returns the images on the device. On the CPU
    this is exactly :func:`sample_released`."""

    def __init__(self, release: CentralRelease, *, image_size: int,
                 device: torch.device | str = "cpu") -> None:
        self.device, self.image_size = torch.device(device), image_size
        self.images: torch.Tensor | None = None
        self.means: torch.Tensor | None = None
        self.components: torch.Tensor | None = None
        if release.components is None:
            self.images = torch.from_numpy(np.ascontiguousarray(release.images)).permute(
                0, 3, 1, 2).float().to(self.device)
        else:
            means = release.means.reshape(-1, *release.means.shape[2:])
            self.means = torch.from_numpy(np.ascontiguousarray(means)).to(self.device)
            self.components = torch.from_numpy(release.components).to(self.device).double()

    def __call__(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        idx = index.to(self.device)
        if self.images is not None:
            return self.images[idx]
        assert self.means is not None and self.components is not None
        comps = self.components[idx]  # [n, k, h, w, c]
        z = torch.randn(len(index), comps.shape[1], generator=generator,
                        dtype=torch.float64).to(self.device)
        draws = self.means[idx] + torch.einsum("nk,nkhwc->nhwc", z, comps)
        return postprocess_tensor(draws.to(torch.float32),
                                  image_size=self.image_size).permute(0, 3, 1, 2)


def _median3(x: torch.Tensor) -> torch.Tensor:
    """3×3 median filter of [n, c, H, W] (reflect padding)."""
    n, c, h, w = x.shape
    padded = F.pad(x, (1, 1, 1, 1), mode="replicate")
    patches = F.unfold(padded.reshape(n * c, 1, h + 2, w + 2), kernel_size=3)
    return patches.median(dim=1).values.reshape(n, c, h, w)


def postprocess(means: np.ndarray, *, image_size: int) -> np.ndarray:
    """Released means [n, h, w, c] (centred) → float32 images [n, S, S, c] in [0, 1]:
    + 0.5, clamp, bilinear upsampling, 3×3 median blur, mild sharpen, clamp."""
    x = torch.from_numpy(np.ascontiguousarray(means)).to(torch.float32)
    return postprocess_tensor(x, image_size=image_size).numpy()


def postprocess_tensor(means: torch.Tensor, *, image_size: int) -> torch.Tensor:
    """:func:`postprocess` on a float32 tensor [n, h, w, c] on any device (the result
    [n, S, S, c] stays there)."""
    x = means.permute(0, 3, 1, 2)
    x = (x + 0.5).clamp(0.0, 1.0)
    if x.shape[-1] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear",
                          align_corners=False)
    x = _median3(x)
    blurred = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    x = (x + SHARPEN * (x - blurred)).clamp(0.0, 1.0)
    return x.permute(0, 2, 3, 1).contiguous()


def release_central_images(dataset: ImageDataset, spec: CentralImages, *,
                           class_index: Sequence[int], normal_source: NormalDraws,
                           hooks: TrainingHooks, image_size: int | None = None,
                           channels: int | None = None,
                           uniform_source: UniformSource | None = None) -> CentralRelease:
    """Charge, then release the noisy class means of ``dataset`` (see the module docstring).

    Args:
        dataset: the private dataset (images, labels, subjects if its unit is a subject).
        spec: the release's public settings (noise, bound, public class sizes, queries).
        class_index: the model class of each dataset class, in dataset class order (the
            finetune's class_map, or the identity); stamps the released images' labels.
        normal_source: where the noise comes from: ``SecureNormal()`` in production, a
            seeded numpy generator when a test injected the run's generator.
        hooks: :meth:`TrainingHooks.charge_release` is called once, before anything is drawn;
            if it raises, nothing is drawn or released and the error propagates.
        image_size, channels: the model's (the images are preprocessed as the finetune
            does); None: as stored.
        uniform_source: Poisson subsampling's uniforms (tests); None: the OS CSPRNG.

    Returns:
        The released images (post-processed), their labels and the raw noisy means.

    Raises:
        InvalidSpecError: a dataset class without a public size, or a wrong ``class_index``.
    """
    names = dataset.class_names
    missing = [n for n in names if n not in spec.class_sizes]
    if missing:
        raise InvalidSpecError(f"central_images.class_sizes misses classes: {missing}")
    if len(class_index) != len(names):
        raise InvalidSpecError("class_index needs one model class per dataset class")
    size = image_size if image_size is not None else int(dataset.images.shape[1])
    hooks.charge_release(spec)  # before anything is drawn: a refusal releases nothing
    uniforms = uniform_source if uniform_source is not None else secure_uniforms
    num_classes = len(names)
    public = np.array([spec.class_sizes[n] for n in names], dtype=np.float64)
    units = (int(dataset.num_subjects or 0) if dataset.subjects is not None
             else len(dataset))
    all_means, all_components = [], []
    for _ in range(spec.queries):
        mask = None
        normaliser = public
        if spec.sample_rate is not None:
            mask = uniforms(units) < spec.sample_rate
            normaliser = public * spec.sample_rate
        sums = class_sums(dataset.images, dataset.labels, dataset.subjects,
                          downsample=spec.downsample, bound=spec.bound,
                          num_classes=num_classes, sample_mask=mask, image_size=size,
                          channels=channels)
        noise = np.asarray(normal_source.normal(0.0, spec.noise_std, sums.size),
                           dtype=np.float64).reshape(sums.shape)
        query_means = (sums + noise) / normaliser[:, None, None, None]
        all_means.append(query_means)
        del sums
        if spec.second_moments:
            moments = noisy_symmetric(
                class_second_moments(dataset.images, dataset.labels, dataset.subjects,
                                     downsample=spec.downsample, bound=spec.bound,
                                     num_classes=num_classes, sample_mask=mask,
                                     image_size=size, channels=channels),
                spec.bound, spec.noise_std, normal_source)
            all_components.append(released_components(
                moments, query_means.reshape(num_classes, -1), bound=spec.bound,
                normaliser=normaliser, components=spec.components))
            del moments
    means = np.stack(all_means)
    images = postprocess(means.reshape(-1, *means.shape[2:]), image_size=size)
    labels = np.tile(np.asarray(class_index, dtype=np.int64), spec.queries)
    components = None
    if all_components:
        stacked = np.concatenate(all_components)  # [queries·C, k, d]
        components = stacked.reshape(*stacked.shape[:2], *means.shape[2:])
    return CentralRelease(images=images, labels=labels, means=means, components=components)
