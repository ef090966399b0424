"""Images of the report as ``data:`` PNG URIs (the page references nothing outside itself).

Grids are one PNG per row of images (a montage) rather than one per image: a report with a
few hundred samples stays a few hundred kilobytes. The page scales them up with
``image-rendering: pixelated`` so 8x8 or 28x28 pixels stay crisp.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

_PAD = 2
_BACKGROUND = 255


def _as_uint8(images: np.ndarray) -> np.ndarray:
    """[N, H, W, C] uint8 with C in {1, 3} (a float array in [0, 1] or [0, 255] is rescaled)."""
    array = np.asarray(images)
    if array.ndim == 3:
        array = array[..., None]
    if array.dtype != np.uint8:
        scale = 255.0 if float(np.nanmax(array, initial=0.0)) <= 1.0 else 1.0
        array = np.clip(np.nan_to_num(array) * scale, 0, 255).round().astype(np.uint8)
    if array.shape[-1] not in (1, 3):
        array = array[..., :1]
    return array


def montage(images: np.ndarray, *, columns: int | None = None) -> np.ndarray:
    """Tile ``images`` [N, H, W, C] into one image with a light gutter between tiles."""
    array = _as_uint8(images)
    n, h, w, c = array.shape
    cols = max(1, min(columns or n, n))
    rows = max(1, -(-n // cols))
    out = np.full((rows * (h + _PAD) + _PAD, cols * (w + _PAD) + _PAD, c), _BACKGROUND,
                  dtype=np.uint8)
    for i in range(n):
        r, col = divmod(i, cols)
        y, x = _PAD + r * (h + _PAD), _PAD + col * (w + _PAD)
        out[y:y + h, x:x + w] = array[i]
    return out


def png_data_uri(image: np.ndarray) -> str:
    """One uint8 image [H, W, C] as a ``data:image/png;base64`` URI."""
    array = _as_uint8(image[None])[0]
    pil = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
