"""What a model is conditioned on, read from its stored info (never from its weights)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def layout_channels(info: Mapping[str, Any]) -> int:
    """The number of layout channels a model's denoiser takes (0: no layout conditioning).

    Read from, in order: ``layout_channels`` (the api's stored info), ``extra.layout_channels``
    (``dpsynth_model.json`` as the ML core writes it), and ``layout_conditioning: true`` (a
    pretrain job's metadata; counted as one channel when the number is not given).
    """
    value = info.get("layout_channels")
    extra = info.get("extra")
    if value is None and isinstance(extra, Mapping):
        value = extra.get("layout_channels")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 1 if info.get("layout_conditioning") is True else 0
