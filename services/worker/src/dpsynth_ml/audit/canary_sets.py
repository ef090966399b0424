"""The canaries of a black-box audit and the training set they join, per privacy unit.

A one-run audit (Steinke, Nasr and Jagielski 2023) is a lower bound only if each canary is
one PRIVACY UNIT of the audited mechanism, put in with its own fair coin: the DP claim
bounds what one unit changes, so a canary smaller than a unit would test a weaker claim
than the one made, and one larger than a unit a stronger one (the bound would be wrong).

* Record-level runs (``RecordLevel``): a canary is one image; the stand-in keeps N̂ - m of
  its records, so the training set never exceeds the audited N̂ records.
* Subject-level runs (``SubjectLevel``, user-level DP-SGD): a canary is one SUBJECT of
  ``per_unit`` images (the run's ``max_images_per_subject``: the largest contribution the
  run lets one subject make, so the canary is the strongest subject the claim covers), all
  with the one label a record canary would have; the whole subject is in or out. The
  stand-in keeps N̂ - m of its subjects (N̂ counts subjects), with all their images, so
  the subject count never exceeds N̂. Its subjects are its own when it carries them (the
  worker gives it subjects of ``max_images_per_subject`` images, ``runners.audit``), else
  groups of ``per_unit`` consecutive records.

Subject indices in the training set are dense 0..S-1: the stand-in's kept subjects first,
then the included canary subjects (``SubjectPoissonSampler`` samples each index alike).

A stand-in with layout masks (DP-DocLDM: a layout-conditioned model, or a layout generator
whose records ARE the masks) gives each canary image a mask of its own: uniform random
pixels, 0 or 255, unlike any document's text lines, so the canary is far from the data
whichever of the two the model learns (the image given its mask, or the mask itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsynth_ml.data import ImageDataset
from dpsynth_ml.spec import InvalidSpecError


@dataclass(frozen=True)
class TrainingSet:
    """The audited run's training set: the cut stand-in and the included canaries.

    Attributes:
        dataset: what the finetune trains on (with dense ``subjects`` for a subject run).
        stand_in_records: the stand-in's images in it.
        stand_in_subjects: the stand-in's subjects in it (None for a record-level run).
    """

    dataset: ImageDataset
    stand_in_records: int
    stand_in_subjects: int | None


def draw_canaries(data: ImageDataset, m: int, rng: np.random.Generator,
                  audited_class: str | None, per_unit: int = 1) -> ImageDataset:
    """m canary units of ``per_unit`` images of uniform noise each (unit-major), in the
    stand-in's shape: far from any data, so what the model learns of one is its own.

    Each unit has one uniformly drawn label for all its images (per label: the audited
    class, the only one its run trains on). Canary u's images are rows
    ``u * per_unit .. (u + 1) * per_unit - 1``.
    """
    shape = data.images.shape[1:]
    images = rng.integers(0, 256, size=(m * per_unit, *shape), dtype=np.uint8)
    names = list(data.class_names)
    if audited_class is not None:
        labels = np.full(m, names.index(audited_class), dtype=np.int64)
    else:
        labels = rng.integers(0, len(names), size=m, dtype=np.int64)
    masks = None
    if data.masks is not None:  # one random binary mask per canary image
        masks = (rng.integers(0, 2, size=(m * per_unit, *data.masks.shape[1:]),
                              dtype=np.uint8) * 255).astype(np.uint8)
    return ImageDataset(images=images, labels=np.repeat(labels, per_unit),
                        class_names=data.class_names, masks=masks)


def record_training_set(data: ImageDataset, canaries: ImageDataset, included: np.ndarray,
                        *, population: int, rng: np.random.Generator) -> TrainingSet:
    """N̂ - m stand-in records (a uniform choice) and the included record canaries."""
    keep = np.sort(rng.permutation(len(data))[:population - len(canaries)])
    dataset = ImageDataset(
        images=np.concatenate([data.images[keep], canaries.images[included]]),
        labels=np.concatenate([data.labels[keep], canaries.labels[included]]),
        class_names=data.class_names, masks=_masks(data, keep, canaries, included))
    return TrainingSet(dataset, stand_in_records=int(keep.size), stand_in_subjects=None)


def subject_training_set(data: ImageDataset, canaries: ImageDataset, included: np.ndarray,
                         *, population: int, per_unit: int,
                         rng: np.random.Generator) -> TrainingSet:
    """N̂ - m stand-in subjects (a uniform choice, all their images) and the included
    canary subjects (all ``per_unit`` images of each), re-indexed densely.

    Args:
        data: the stand-in (its ``subjects`` kept when it has them).
        canaries: m canary subjects of ``per_unit`` images each (:func:`draw_canaries`).
        included: [m] each canary subject's coin.
        population: N̂, in subjects.
        per_unit: images per stand-in subject when the stand-in carries no subjects.
        rng: the cut.
    """
    own = (np.asarray(data.subjects, dtype=np.int64) if data.subjects is not None
           else np.arange(len(data), dtype=np.int64) // per_unit)
    # only subjects with an image here count (a per-label class keeps its dataset's S)
    present = np.unique(own)
    m = int(included.size)
    chosen = np.sort(rng.permutation(present)[:population - m])
    keep = np.flatnonzero(np.isin(own, chosen))
    stand_in_subjects = np.searchsorted(chosen, own[keep])
    images_in = np.repeat(included, per_unit)
    canary_subjects = chosen.size + np.repeat(np.arange(int(included.sum())), per_unit)
    dataset = ImageDataset(
        images=np.concatenate([data.images[keep], canaries.images[images_in]]),
        labels=np.concatenate([data.labels[keep], canaries.labels[images_in]]),
        class_names=data.class_names, masks=_masks(data, keep, canaries, images_in),
        subjects=np.concatenate([stand_in_subjects, canary_subjects]).astype(np.int64),
        num_subjects=int(chosen.size + included.sum()))
    return TrainingSet(dataset, stand_in_records=int(keep.size),
                       stand_in_subjects=int(chosen.size))


def _masks(data: ImageDataset, keep: np.ndarray, canaries: ImageDataset,
           canary_rows: np.ndarray) -> np.ndarray | None:
    """The kept stand-in images' masks, then the included canary images' (None when the
    stand-in has none)."""
    if data.masks is None:
        return None
    if canaries.masks is None:
        raise InvalidSpecError("the canaries need layout masks as the stand-in has them")
    return np.concatenate([data.masks[keep], canaries.masks[canary_rows]])
