"""Encoding the private records at a cost set by the public size N̂, not the true count.

A finetune encodes its records with the frozen VAE (a pixel-space model: preprocesses them,
``models.codec``) before its first step (per label: each
class's records before the class's first step), so the time that takes would show the
true count between progress reports and in the job's run time. After the real records,
:func:`encode_blanks` encodes blank images up to N̂ (and as many blank masks for a
layout-conditioned model) and discards them: the same encoder calls, chunked so that the
real and blank chunks together cost as much as N̂ records would (docs/privacy.md, "Progress,
ETA and timing"). The image unit only: for subjects N̂ counts subjects, not images.
"""

from __future__ import annotations

import numpy as np
import torch

from dpsynth_ml.models.architectures import ModelBundle
from dpsynth_ml.models.codec import _ENCODE_CHUNK, encode_records
from dpsynth_ml.spec import ModelInfo


def blank_chunks(real: int, public: int, chunk: int = _ENCODE_CHUNK) -> list[int]:
    """Sizes of the blank encoder calls that pad ``real`` encoded rows to ``public``: the
    first tops up the real rows' last partial chunk, the rest are full chunks."""
    missing = max(0, public - real)
    first = min(missing, (chunk - real % chunk) % chunk)
    sizes = [first] if first else []
    rest = missing - first
    sizes += [chunk] * (rest // chunk) + ([rest % chunk] if rest % chunk else [])
    return sizes


@torch.no_grad()
def encode_blanks(bundle: ModelBundle, info: ModelInfo, *, real: int, public: int,
                  masks: bool) -> int:
    """Encode blank images (and blank masks when ``masks``) from ``real`` up to ``public``
    rows, discarding the latents; returns how many blank rows were encoded."""
    sizes = blank_chunks(real, public)
    if not sizes:
        return 0
    blank = np.zeros((max(sizes), info.image_size, info.image_size, info.channels),
                     dtype=np.uint8)
    for size in sizes:
        for _ in range(2 if masks else 1):
            encode_records(bundle, info, blank[:size])
    return sum(sizes)


__all__ = ["blank_chunks", "encode_blanks"]
