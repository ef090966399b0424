"""Canonical dataset files (``.npz``) and their preprocessing into model-ready tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth_ml.spec import InvalidSpecError


@dataclass(frozen=True)
class ImageDataset:
    """An image classification dataset as stored in the canonical npz.

    Attributes:
        images: uint8 array [N, H, W, C].
        labels: int64 array [N], indices into ``class_names``.
        class_names: the public label domain, in index order.
        masks: optional layout masks, uint8 [N, H, W, 1] (0 background, 255 text line),
            one per image (DP-DocLDM layout conditioning). Masks of a private dataset are
            private: they are read only inside the DP finetune, like the images.
        subjects: optional int64 [N]: each image's subject as a dense index 0..S-1 (a
            dataset whose privacy unit is ``subject``; trained with user-level DP-SGD).
        num_subjects: S (None without subjects); a class subset keeps its dataset's S.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    masks: np.ndarray | None = None
    subjects: np.ndarray | None = None
    num_subjects: int | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])


def load_dataset(path: Path) -> ImageDataset:
    """Load and validate a canonical dataset file.

    Args:
        path: an ``.npz`` with ``images`` (uint8 [N,H,W,C]), ``labels`` (int64 [N]) and
            ``class_names`` (unicode [K]), optionally ``masks`` (uint8 [N,H,W,1]) and
            ``subjects`` (integer [N], dense subject indices). Loaded with
            ``allow_pickle=False``.

    Returns:
        The validated dataset.

    Raises:
        InvalidSpecError: on a missing array, a wrong dtype/shape or an out-of-range label.
    """
    with np.load(Path(path), allow_pickle=False) as npz:
        missing = {"images", "labels", "class_names"} - set(npz.files)
        if missing:
            raise InvalidSpecError(f"dataset misses arrays: {sorted(missing)}")
        images, labels, names = npz["images"], npz["labels"], npz["class_names"]
        masks = npz["masks"] if "masks" in npz.files else None
        subjects = npz["subjects"] if "subjects" in npz.files else None
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise InvalidSpecError("images must be uint8 [N, H, W, C] with C in (1, 3)")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise InvalidSpecError("labels must be [N] and match images")
    if not np.issubdtype(labels.dtype, np.integer):
        raise InvalidSpecError("labels must be integers")
    if names.ndim != 1 or names.dtype.kind != "U" or names.shape[0] < 1:
        raise InvalidSpecError("class_names must be a non-empty unicode array [K]")
    if labels.size and (labels.min() < 0 or labels.max() >= names.shape[0]):
        raise InvalidSpecError("labels must index class_names")
    if masks is not None and (masks.dtype != np.uint8 or masks.ndim != 4
                              or masks.shape[0] != images.shape[0] or masks.shape[-1] != 1):
        raise InvalidSpecError("masks must be uint8 [N, H, W, 1] with one mask per image")
    num_subjects = None
    if subjects is not None:
        if (subjects.ndim != 1 or subjects.shape[0] != images.shape[0]
                or not np.issubdtype(subjects.dtype, np.integer)
                or (subjects.size and subjects.min() < 0)):
            raise InvalidSpecError("subjects must be non-negative integers [N], one per image")
        subjects = subjects.astype(np.int64)
        num_subjects = int(subjects.max()) + 1 if subjects.size else 0
    return ImageDataset(images=images, labels=labels.astype(np.int64),
                        class_names=tuple(str(n) for n in names), masks=masks,
                        subjects=subjects, num_subjects=num_subjects)


def training_view(dataset: ImageDataset, target: str) -> ImageDataset:
    """The records a job trains on: the dataset itself, or with ``target == "masks"`` its
    layout masks in place of its images (same labels; a layout generator).

    The masks of a private dataset are private data of that dataset: they are read only
    inside the DP finetune, exactly like its images (same Poisson sampling, same clipping).

    Raises:
        InvalidSpecError: target "masks" on a dataset without masks, or an unknown target.
    """
    if target == "images":
        return dataset
    if target != "masks":
        raise InvalidSpecError(f"unknown target {target!r}")
    if dataset.masks is None:
        raise InvalidSpecError("target 'masks' needs a dataset with layout masks")
    return ImageDataset(images=dataset.masks, labels=dataset.labels,
                        class_names=dataset.class_names, masks=None,
                        subjects=dataset.subjects, num_subjects=dataset.num_subjects)


def images_to_tensor(images: np.ndarray, *, image_size: int, channels: int) -> torch.Tensor:
    """Convert uint8 [N,H,W,C] images to float [N, channels, size, size] in [-1, 1].

    Resizing is bilinear (antialiased when shrinking); RGB→gray uses ITU-R 601 luma and
    gray→RGB repeats the channel.
    """
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    if x.shape[1] == 3 and channels == 1:
        weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
        x = (x * weights).sum(dim=1, keepdim=True)
    elif x.shape[1] == 1 and channels == 3:
        x = x.repeat(1, 3, 1, 1)
    if x.shape[-2:] != (image_size, image_size) and x.shape[0] > 0:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear",
                          align_corners=False, antialias=True)
    return x.clamp(-1.0, 1.0).contiguous()
