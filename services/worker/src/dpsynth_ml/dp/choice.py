"""Which clipping engine a finetune uses: book-keeping where it is exact and faster, the
opacus hooks engine elsewhere.

Both release the same mechanism (per-unit clipping to C, one noise draw per step, division
by the expected batch size; see :mod:`dpsynth_ml.dp.engine` and
:mod:`dpsynth_ml.dp.bookkeeping`), so the choice changes cost, not privacy. Rules:

* ``bookkeeping`` when every trainable parameter is in a layer it supports exactly
  (:func:`~dpsynth_ml.dp.bookkeeping.unsupported_parameters` is empty) and the trainable set
  is not one where hooks are measured at least as fast. Every unit structure (K draws per
  example, subjects split across micro-batches) is exact in both engines, so the unit does
  not enter the choice.
* ``hooks`` otherwise: for ``attention`` / ``output_attention`` (a few Linear layers on
  short token sequences: opacus' per-example gradients are small and its one backward
  already computes them), and for any trainable layer book-keeping does not support.

The choice is recorded in the model's metadata (``extra["dp_engine"]``).
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from dpsynth_ml.dp.bookkeeping import unsupported_parameters

EngineKind = Literal["bookkeeping", "hooks"]
#: trainable sets for which the hooks engine is kept (see the module docstring)
HOOKS_TRAINABLE = frozenset({"attention", "output_attention"})


def choose_engine(module: nn.Module, *, trainable: str) -> EngineKind:
    """The engine for ``module`` with its current trainable parameters (``trainable`` is the
    spec's trainable set: full, attention, output_attention, blocks, lora)."""
    if trainable in HOOKS_TRAINABLE or unsupported_parameters(module):
        return "hooks"
    return "bookkeeping"
