"""Decoding one uploaded image safely (pixel cap against decompression bombs)."""

from __future__ import annotations

import io
import warnings

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from PIL import Image, UnidentifiedImageError

_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "F"})


def decode_image(data: bytes, *, max_pixels: int, where: str) -> np.ndarray:
    """Decode image bytes to uint8 ``[H, W]`` (grayscale) or ``[H, W, 3]`` (colour).

    The header's size is checked against ``max_pixels`` before any pixel is decoded, and
    PIL's own bomb check (``Image.MAX_IMAGE_PIXELS``) is turned into an error.

    Args:
        data: the file's bytes.
        max_pixels: the largest width x height accepted.
        where: how to name the file in an error ("a member" for private data).

    Raises:
        DpsynthError: ``unsafe_archive`` for a decompression bomb, ``invalid_image`` for a
            file that is not a readable image.
    """
    bomb = DpsynthError(ErrorCode.UNSAFE_ARCHIVE,
                        f"{where} declares more than {max_pixels} pixels (decompression bomb?)",
                        limit=max_pixels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
                if width * height > max_pixels:
                    raise bomb
                gray = im.mode in _GRAY_MODES
                im.load()
                converted = im.convert("L" if gray else "RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise bomb from exc
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
            raise DpsynthError(ErrorCode.INVALID_IMAGE,
                               f"{where} is not a readable image") from exc
    return np.asarray(converted, dtype=np.uint8)
