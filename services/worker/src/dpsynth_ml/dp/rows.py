"""Explicit per-unit gradient rows, as both engines take them (``accumulate_gradients``):
the white-box audit's gradient canaries (issue 19)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_gradient_rows(rows: Sequence[torch.Tensor],
                        params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Explicit per-unit gradient rows, one [n, *p.shape] tensor per parameter with the same
    n, moved to each parameter's device and dtype.

    Raises:
        ValueError: if they do not match the parameters.
    """
    rows = list(rows)
    if len(rows) != len(params):
        raise ValueError(f"{len(rows)} gradient rows for {len(params)} trainable parameters")
    if len({r.shape[0] for r in rows}) != 1:
        raise ValueError("every parameter needs the same number of unit rows")
    for r, p in zip(rows, params, strict=True):
        if tuple(r.shape[1:]) != tuple(p.shape):
            raise ValueError(f"rows of shape {tuple(r.shape[1:])} for a parameter of shape "
                             f"{tuple(p.shape)}")
    return [r.to(device=p.device, dtype=p.dtype) for r, p in zip(rows, params, strict=True)]
