"""Explicit per-unit gradient rows, as both engines take them (``accumulate_gradients``),
and the book-keeping engine's clipping of such rows and of one-hot units
(``accumulate_one_hot``): the white-box audit's gradient canaries (issue 19)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dpsynth_ml.dp.bookkeeping.layers import _sq

ClipFactors = Callable[[torch.Tensor], torch.Tensor]


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


def clipped_row_sums(rows: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                     clip_factors: ClipFactors) -> tuple[list[torch.Tensor] | None, torch.Tensor]:
    """(the sum over units of each unit's rows times its clip factor, per parameter; None
    for no unit) and the units' float64 norms."""
    rows = check_gradient_rows(rows, params)
    n = rows[0].shape[0]
    sq = torch.zeros(n, dtype=torch.float64, device=rows[0].device)
    for r in rows:
        sq += _sq(r).to(sq.device)
    norms = sq.sqrt()
    if not n:
        return None, norms
    factors = clip_factors(norms)
    return [(r * factors.to(r.device, r.dtype).view(-1, *([1] * (r.dim() - 1)))).sum(0)
            for r in rows], norms


def clipped_one_hot_sums(positions: torch.Tensor, values: torch.Tensor,
                         params: Sequence[torch.Tensor], clip_factors: ClipFactors,
                         ) -> tuple[list[torch.Tensor] | None, torch.Tensor]:
    """As :func:`clipped_row_sums` for units that are each ``values[i]`` at the flat position
    ``positions[i]`` of the concatenated ``params`` and 0 elsewhere (norm ``|values[i]|``),
    summed on the parameters' device in O(n)."""
    positions, values = positions.flatten().to(torch.long), values.flatten()
    if positions.shape != values.shape:
        raise ValueError("one value per position")
    sizes = [p.numel() for p in params]
    device = params[0].device
    values = values.to(device=device, dtype=torch.float64)
    norms = values.abs()
    if not positions.numel():
        return None, norms
    if int(positions.min()) < 0 or int(positions.max()) >= sum(sizes):
        raise ValueError("a position outside the trainable values")
    flat = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
    flat.index_add_(0, positions.to(device), values * clip_factors(norms))
    return [part.view(p.shape).to(device=p.device, dtype=p.dtype)
            for part, p in zip(torch.split(flat, sizes), params, strict=True)], norms
