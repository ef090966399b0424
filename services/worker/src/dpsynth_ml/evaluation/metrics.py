"""Distribution metrics on feature (or pixel) vectors: Fréchet distance, precision / recall /
density / coverage, and the memorisation check.

All functions take float arrays [N, D] (or uint8 images, for pixel-space memorisation) and
return plain numbers or numpy arrays; distances are Euclidean, computed in float64 in
chunks so that 5000 x 5000 sets fit in a few hundred MB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dpsynth_ml.spec import InvalidSpecError

#: d_train / d_holdout below this flags a synthetic image as a likely copy (docs/evaluation.md)
MEMORISATION_RATIO = 1.0 / 3.0
#: pixel space: an RMS difference (on [0, 1]) of at most one grey level is an exact copy
EXACT_COPY_RMS = 1.0 / 255.0
#: feature space: d_train at most this share of the median d_holdout is an exact copy
EXACT_COPY_FEATURE_SHARE = 1e-4
_CHUNK = 1024


def _as_matrix(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise InvalidSpecError(f"{name} must be a 2-d array [N, D]")
    if not np.isfinite(a).all():
        raise InvalidSpecError(f"{name} has non-finite values")
    return a


def _sqrt_psd(m: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix (negative rounding eigenvalues -> 0)."""
    w, v = np.linalg.eigh((m + m.T) / 2.0)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T  # type: ignore[no-any-return]


def frechet_distance_gaussians(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray,
                               cov2: np.ndarray) -> float:
    """Fréchet (2-Wasserstein squared) distance between N(mu1, cov1) and N(mu2, cov2):
    ``|mu1 - mu2|^2 + tr(C1) + tr(C2) - 2 tr((C1^{1/2} C2 C1^{1/2})^{1/2})``.

    The trace term uses ``eig(C1 C2) = eig(C1^{1/2} C2 C1^{1/2})``: the latter matrix is
    symmetric PSD, so its eigenvalues come from ``eigh`` and are real; tiny negative ones
    from rounding are clipped to 0. This is exact for singular (rank-deficient) covariances,
    where ``scipy.linalg.sqrtm(C1 @ C2)`` of the non-symmetric product can return complex
    values or fail and needs an ad-hoc diagonal offset.
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    cov1, cov2 = np.asarray(cov1, np.float64), np.asarray(cov2, np.float64)
    if mu1.shape != mu2.shape or cov1.shape != cov2.shape or cov1.shape != mu1.shape * 2:
        raise InvalidSpecError("means and covariances must have matching dimensions")
    s1 = _sqrt_psd(cov1)
    inner = s1 @ cov2 @ s1
    eig = np.linalg.eigvalsh((inner + inner.T) / 2.0)
    trace_sqrt = float(np.sqrt(np.clip(eig, 0.0, None)).sum())
    diff = mu1 - mu2
    value = float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * trace_sqrt)
    return max(value, 0.0)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two sets of vectors (Heusel et al. 2017,
    "GANs trained by a two time-scale update rule", the FID formula).

    Means and unbiased covariances (ddof = 1) of each set; see
    :func:`frechet_distance_gaussians` for the numerics. With fewer samples than dimensions
    the covariances are rank-deficient: the value is still defined but biased upwards (the
    bias of FID falls like 1/N), so compare only values computed on equal set sizes.

    Args:
        a, b: [N_a, D] and [N_b, D] vectors, N >= 2 each.

    Raises:
        InvalidSpecError: different D, fewer than 2 vectors, non-finite values.
    """
    a, b = _as_matrix(a, "a"), _as_matrix(b, "b")
    if a.shape[1] != b.shape[1]:
        raise InvalidSpecError("both sets must have the same dimension")
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise InvalidSpecError("the Fréchet distance needs at least 2 vectors per set")
    cov_a = np.atleast_2d(np.cov(a, rowvar=False))
    cov_b = np.atleast_2d(np.cov(b, rowvar=False))
    return frechet_distance_gaussians(a.mean(axis=0), cov_a, b.mean(axis=0), cov_b)


def _nearest(query: torch.Tensor, ref: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest distances (ascending) from each query row to ``ref`` and their indices."""
    dists, idx = [], []
    for start in range(0, query.shape[0], _CHUNK):
        d = torch.cdist(query[start:start + _CHUNK], ref)
        values, indices = torch.topk(d, k, dim=1, largest=False, sorted=True)
        dists.append(values)
        idx.append(indices)
    return torch.cat(dists), torch.cat(idx)


def knn_radii(x: torch.Tensor, k: int) -> torch.Tensor:
    """Distance from each row of ``x`` to its k-th nearest neighbour in ``x`` other than
    itself (the self-distance 0 is the first of the k + 1 smallest)."""
    if x.shape[0] <= k:
        raise InvalidSpecError(f"k-NN radii need more than k = {k} vectors per set")
    return _nearest(x, x, k + 1)[0][:, k]


def _count_in_balls(query: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor
                    ) -> torch.Tensor:
    """For each query row, how many balls B(centre_j, radius_j) contain it."""
    counts = []
    for start in range(0, query.shape[0], _CHUNK):
        d = torch.cdist(query[start:start + _CHUNK], centres)
        counts.append((d <= radii[None, :]).sum(dim=1))
    return torch.cat(counts)


def prdc(real: np.ndarray, fake: np.ndarray, *, k: int = 5) -> dict[str, float]:
    """Precision, recall (Kynkäänniemi et al. 2019, "Improved precision and recall metric for
    assessing generative models") and density, coverage (Naeem et al. 2020, "Reliable
    fidelity and diversity metrics for generative models") from k-NN manifolds.

    Each vector's ball has the radius of its k-th nearest neighbour in its own set (itself
    excluded). precision: share of fake vectors inside some real ball; recall: share of real
    vectors inside some fake ball; density: mean number of real balls holding a fake vector,
    divided by k (about 1 for matching distributions, can exceed 1); coverage: share of real
    vectors whose ball holds at least one fake vector (its nearest fake is within its
    radius). A set against itself has precision = recall = coverage = 1.

    Args:
        real, fake: [N, D] and [M, D] vectors, each with more than k rows.
        k: the neighbourhood size.
    """
    if k < 1:
        raise InvalidSpecError("k must be >= 1")
    r_np, f_np = _as_matrix(real, "real"), _as_matrix(fake, "fake")
    if r_np.shape[1] != f_np.shape[1]:
        raise InvalidSpecError("both sets must have the same dimension")
    r, f = torch.from_numpy(r_np), torch.from_numpy(f_np)
    real_radii, fake_radii = knn_radii(r, k), knn_radii(f, k)
    fake_in_real = _count_in_balls(f, r, real_radii)
    real_in_fake = _count_in_balls(r, f, fake_radii)
    nearest_fake = _nearest(r, f, 1)[0][:, 0]
    return {
        "precision": float((fake_in_real > 0).double().mean()),
        "recall": float((real_in_fake > 0).double().mean()),
        "density": float(fake_in_real.double().mean() / k),
        "coverage": float((nearest_fake <= real_radii).double().mean()),
    }


@dataclass(frozen=True)
class MemorisationResult:
    """Per-synthetic-image distances to the private training and the held-out images.

    Attributes:
        space: "pixel" (L2 on [0, 1] pixels) or "features".
        d_train, d_holdout: float64 [M] distance to the nearest training / held-out vector.
        nearest_train, nearest_holdout: int64 [M] indices of those nearest vectors.
        ratio: float64 [M] d_train / d_holdout (1 where both are 0, inf where only
            d_holdout is 0).
        exact: bool [M] exact copies of a training image (d_train within tolerance).
        flagged: bool [M] exact copies or ratio below ``threshold``.
        threshold: the ratio threshold (MEMORISATION_RATIO).
        exact_tolerance: the d_train at or below which a vector counts as an exact copy.
        closest: int64 indices of synthetic vectors, the most suspicious first (ascending
            ratio, then ascending d_train), at most ``pairs`` of them: the pairs
            (synthetic[i], train[nearest_train[i]]) a report shows side by side.
        train_size, holdout_size: sizes of the reference sets.
    """

    space: Literal["pixel", "features"]
    d_train: np.ndarray
    d_holdout: np.ndarray
    nearest_train: np.ndarray
    nearest_holdout: np.ndarray
    ratio: np.ndarray
    exact: np.ndarray
    flagged: np.ndarray
    threshold: float
    exact_tolerance: float
    closest: np.ndarray
    train_size: int
    holdout_size: int

    def summary(self) -> dict[str, Any]:
        """The summary of ``dpsynth_shared.evaluation.Memorisation`` (plus the set sizes)."""
        m = int(self.d_train.shape[0])
        return {
            "space": self.space,
            "synthetic": m,
            "flagged": int(self.flagged.sum()),
            "threshold": float(self.threshold),
            "exact_copies": int(self.exact.sum()),
            "fraction_closer_to_train": float((self.d_train < self.d_holdout).mean())
            if m else 0.0,
            # finite for JSON: inf only where a synthetic image copies a held-out image
            "median_ratio": float(min(np.median(self.ratio), 1e300)) if m else 0.0,
            # exchangeability: with nothing memorised, the chance that the nearest of the
            # train + holdout images is a training image is the training share
            "expected_fraction_closer_to_train": self.train_size
            / (self.train_size + self.holdout_size),
            "train_size": self.train_size,
            "holdout_size": self.holdout_size,
            "exact_tolerance": float(self.exact_tolerance),
        }


def _vectors(x: np.ndarray, space: str, name: str) -> np.ndarray:
    x = np.asarray(x)
    if space == "pixel":
        if x.ndim < 2:
            raise InvalidSpecError(f"{name}: pixel space needs images [N, ...]")
        flat = x.reshape(x.shape[0], -1)
        return flat.astype(np.float64) / 255.0 if x.dtype == np.uint8 else _as_matrix(
            flat, name)
    return _as_matrix(x, name)


def memorisation(synthetic: np.ndarray, train: np.ndarray, holdout: np.ndarray, *,
                 space: Literal["pixel", "features"] = "pixel",
                 threshold: float = MEMORISATION_RATIO, pairs: int = 16) -> MemorisationResult:
    """For each synthetic image: distance to its nearest private training image versus its
    nearest held-out image (same distribution, never trained on).

    A generator that generalises puts its samples about as close to held-out images as to
    training images; one that memorised puts some samples next to a training image, far
    closer than to anything held out. Flagged: exact copies, and images with
    ``d_train / d_holdout < threshold`` (1/3 by default: the "closer than a third" criterion
    of the memorisation literature, with the nearest held-out image in place of the second
    nearest training image; docs/evaluation.md).

    Args:
        synthetic, train, holdout: for ``space="pixel"`` images of one shape (uint8, scaled
            to [0, 1], or floats already in [0, 1]); for ``space="features"`` vectors [N, D].
        space: recorded in the result; selects the input convention and the exact-copy
            tolerance (RMS of one grey level in pixel space; 1e-4 of the median d_holdout
            in feature space).
        threshold: the ratio threshold.
        pairs: how many of the most suspicious synthetic images to list in ``closest``.

    Raises:
        InvalidSpecError: mismatched shapes or an empty reference set.
    """
    if space not in ("pixel", "features"):
        raise InvalidSpecError(f"unknown space {space!r}")
    s = _vectors(synthetic, space, "synthetic")
    t = _vectors(train, space, "train")
    h = _vectors(holdout, space, "holdout")
    if not s.shape[1] == t.shape[1] == h.shape[1]:
        raise InvalidSpecError("synthetic, train and holdout must have the same shape")
    if t.shape[0] == 0 or h.shape[0] == 0:
        raise InvalidSpecError("memorisation needs training and held-out images")
    st = torch.from_numpy(s)
    d_train_t, i_train = _nearest(st, torch.from_numpy(t), 1)
    d_hold_t, i_hold = _nearest(st, torch.from_numpy(h), 1)
    d_train, d_hold = d_train_t[:, 0].numpy(), d_hold_t[:, 0].numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d_hold > 0, d_train / np.where(d_hold > 0, d_hold, 1.0),
                         np.where(d_train > 0, np.inf, 1.0))
    if space == "pixel":
        tolerance = EXACT_COPY_RMS * float(np.sqrt(s.shape[1]))
    else:
        tolerance = EXACT_COPY_FEATURE_SHARE * float(np.median(d_hold)) if len(d_hold) else 0.0
    exact = d_train <= tolerance
    flagged = exact | (ratio < threshold)
    order = np.lexsort((d_train, ratio))[:max(pairs, 0)]
    return MemorisationResult(
        space=space, d_train=d_train, d_holdout=d_hold,
        nearest_train=i_train[:, 0].numpy().astype(np.int64),
        nearest_holdout=i_hold[:, 0].numpy().astype(np.int64), ratio=ratio, exact=exact,
        flagged=flagged, threshold=float(threshold), exact_tolerance=tolerance,
        closest=order.astype(np.int64), train_size=int(t.shape[0]),
        holdout_size=int(h.shape[0]))
