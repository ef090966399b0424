"""The released central images on disk: ``central_images.npz`` (images, labels, the raw noisy
means and the public settings they were released under) and a preview grid
``central_images.png`` (one row per class, one column per query). Both are public."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from dpsynth_ml.spec import CentralImages, InvalidSpecError
from dpsynth_ml.warmup.release import CentralRelease

RELEASE_FILE = "central_images.npz"
PREVIEW_FILE = "central_images.png"


def release_settings(spec: CentralImages) -> dict[str, Any]:
    """The settings that define a release (a saved one is reused only under the same)."""
    return {"noise_std": float(spec.noise_std), "bound": float(spec.bound),
            "downsample": int(spec.downsample), "queries": int(spec.queries),
            "sample_rate": (float(spec.sample_rate) if spec.sample_rate is not None
                            else None),
            **_moment_settings(spec),
            "class_sizes": {str(k): int(v) for k, v in sorted(spec.class_sizes.items())}}


def public_record(spec: CentralImages, n_released: int) -> dict[str, Any]:
    """``ModelInfo.extra["central_images"]``: public settings only, no private quantity."""
    return {"noise_std": float(spec.noise_std), "bound": float(spec.bound),
            "downsample": int(spec.downsample), "queries": int(spec.queries),
            "sample_rate": (float(spec.sample_rate) if spec.sample_rate is not None
                            else None),
            "warmup_steps": int(spec.warmup_steps),
            "warmup_batch_size": int(spec.warmup_batch_size),
            "warmup_learning_rate": float(spec.warmup_learning_rate),
            "warmup_ema_decay": spec.warmup_ema_decay,
            "augment": bool(spec.augment), **_moment_settings(spec),
            "n_released": int(n_released)}


def _moment_settings(spec: CentralImages) -> dict[str, Any]:
    """The second-moment settings (absent without them: a release saved before they existed
    still matches)."""
    if not spec.second_moments:
        return {}
    return {"second_moments": True, "components": int(spec.components)}


def save_release(path: Path, release: CentralRelease, spec: CentralImages) -> Path:
    """Write the release atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    arrays: dict[str, np.ndarray] = {
        "images": release.images.astype(np.float32),
        "labels": release.labels.astype(np.int64), "means": release.means.astype(np.float64),
        "settings": np.array(json.dumps(release_settings(spec), sort_keys=True))}
    if release.components is not None:
        arrays["components"] = release.components.astype(np.float32)
    np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds oddly
    os.replace(tmp, path)
    return path


def load_release(path: Path, spec: CentralImages) -> CentralRelease:
    """Read a saved release made under ``spec``'s settings.

    Raises:
        InvalidSpecError: it was released under other settings.
    """
    with np.load(Path(path), allow_pickle=False) as npz:
        settings = json.loads(str(npz["settings"]))
        release = CentralRelease(images=npz["images"].astype(np.float32),
                                 labels=npz["labels"].astype(np.int64),
                                 means=npz["means"].astype(np.float64),
                                 components=(npz["components"].astype(np.float32)
                                             if "components" in npz.files else None))
    if settings != json.loads(json.dumps(release_settings(spec), sort_keys=True)):
        raise InvalidSpecError("the saved central images were released under other "
                               "settings than this spec's central_images")
    return release


def write_preview(path: Path, images: np.ndarray, num_classes: int) -> Path:
    """A grid of the released images: row c holds class c's image of every query.

    ``images`` is float [queries·C, H, W, c] in [0, 1], query-major.
    """
    n, h, w, c = images.shape
    queries = max(1, math.ceil(n / max(1, num_classes)))
    grid = np.zeros((num_classes * h, queries * w, c), dtype=np.uint8)
    pixels = (np.clip(images, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    for i in range(n):
        query, cls = divmod(i, num_classes)
        grid[cls * h:(cls + 1) * h, query * w:(query + 1) * w] = pixels[i]
    Image.fromarray(grid[..., 0] if c == 1 else grid).save(Path(path))
    return Path(path)
