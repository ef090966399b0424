"""The held-out split at upload (``DatasetMetadata.holdout_fraction``, issue 5, item 1).

An upload may set aside a seeded fraction of its privacy UNITS (images, or subjects for a
``privacy_unit: subject`` dataset) as held-out records: the real test data of evaluate jobs.
They are written as a second canonical npz beside the dataset's object (under the same
prefix, so a private dataset's read grant covers both) and are excluded from everything
else: the dataset's object, its true size and class counts, the default and the minimum of
its declared size N̂, the class-size checks, and so from every job and derived dataset that
trains on it. Their record hashes are still stored with the dataset's (overlap detection
covers them: they are the budget's records too).

The split is a function of the seed and of the unit labels only:

* images are stratified by class: the held-out count T = round(f·U) over the U units is
  shared among the classes by largest remainder of f·n_c (ties broken by the seeded
  generator), then each class's units are drawn by a seeded permutation;
* subjects are stratified by their most frequent class (ties: the first class), and a
  subject's images all go to the same side, so a subject is never on both sides.

The same upload with the same seed gives the same split (``holdout_seed`` is recorded;
without one it is drawn from OS entropy). At least one unit must fall on each side, else
422 ``invalid_dataset``; the message names no count of a private upload.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.datasets.ingest import Ingested

MAX_SEED = 2**63 - 1
"""Seeds are non-negative and fit a signed 64-bit column."""


def draw_seed() -> int:
    """A fresh seed from OS entropy (recorded with the dataset)."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class Split:
    """An upload cut in two: what the dataset trains on and what it holds out."""

    train: Ingested
    holdout: Ingested
    seed: int
    holdout_units: int


def unit_strata(data: Ingested) -> np.ndarray:
    """The class each unit is stratified by: an image's label, or a subject's most frequent
    label (ties: the lowest class index). ``[U]`` int64, in unit order."""
    if data.subjects is None:
        return data.labels.astype(np.int64)
    k = max(len(data.class_names), 1)
    keys = data.subjects.astype(np.int64) * k + data.labels.astype(np.int64)
    unique, counts = np.unique(keys, return_counts=True)
    subject, label = unique // k, unique % k
    order = np.lexsort((label, -counts, subject))  # by subject, count desc, label asc
    subject, label = subject[order], label[order]
    first = np.ones(subject.shape[0], dtype=bool)
    first[1:] = subject[1:] != subject[:-1]
    strata = np.zeros(data.unit_count, dtype=np.int64)
    strata[subject[first]] = label[first]
    return strata


def held_out_units(strata: np.ndarray, fraction: float, seed: int, *,
                   unit: str = "records") -> np.ndarray:
    """Which units are held out: a boolean mask ``[U]``.

    Args:
        strata: each unit's class (:func:`unit_strata`).
        fraction: the held-out share f, 0 < f ≤ 0.5.
        seed: the split's seed.
        unit: what a unit is, for the refusal's wording.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when one side would be empty.
    """
    n = int(strata.shape[0])
    total = math.floor(fraction * n + 0.5)
    if total < 1 or total > n - 1:
        raise DpsynthError(ErrorCode.INVALID_DATASET,
                           f"holdout_fraction {fraction:g} leaves no {unit} on one side of the "
                           f"held-out split; at least one of the upload's {unit} must be held "
                           "out and at least one kept (raise the fraction or upload more)",
                           holdout_fraction=fraction)
    rng = np.random.default_rng(seed)
    classes, inverse, counts = np.unique(strata, return_inverse=True, return_counts=True)
    quotas = fraction * counts.astype(np.float64)
    take = np.floor(quotas).astype(np.int64)
    remainder = total - int(take.sum())
    if remainder > 0:
        ties = np.asarray(rng.random(int(classes.shape[0])), dtype=np.float64)
        order = np.lexsort((ties, take - quotas))  # largest remainder first
        take[order[:remainder]] += 1
    permutation = rng.permutation(n)
    grouped = permutation[np.argsort(inverse[permutation], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mask = np.zeros(n, dtype=bool)
    for start, count in zip(starts.tolist(), take.tolist(), strict=True):
        mask[grouped[start:start + count]] = True
    return mask


def _part(data: Ingested, keep: np.ndarray) -> Ingested:
    """The records at ``keep`` (sorted indices) as their own canonical dataset; subjects are
    renumbered densely within the part."""
    subjects = None
    if data.subjects is not None:
        subjects = np.unique(data.subjects[keep], return_inverse=True)[1].astype(np.int64)
        subjects = subjects.reshape(keep.shape[0])
    return Ingested(images=data.images[keep], labels=data.labels[keep],
                    class_names=list(data.class_names), source_format=data.source_format,
                    masks=None if data.masks is None else data.masks[keep], subjects=subjects)


def split_upload(data: Ingested, fraction: float, seed: int | None) -> Split:
    """Cut an ingested upload into its training part and its held-out part.

    The raw subject ids (``data.subject_ids``) are not carried into either part: the keyed
    subject hashes are computed over the whole upload before the split.

    Raises:
        DpsynthError: 422 ``invalid_dataset`` when one side would be empty.
    """
    seed = draw_seed() if seed is None else seed
    unit = "subjects" if data.subjects is not None else "records"
    mask = held_out_units(unit_strata(data), fraction, seed, unit=unit)
    held = mask if data.subjects is None else mask[data.subjects]
    return Split(train=_part(data, np.flatnonzero(~held)),
                 holdout=_part(data, np.flatnonzero(held)), seed=seed,
                 holdout_units=int(mask.sum()))


def holdout_key(object_key: str) -> str:
    """Where a dataset's held-out npz lives: beside its object (``.../holdout.npz``)."""
    return object_key.rsplit("/", 1)[0] + "/holdout.npz"
