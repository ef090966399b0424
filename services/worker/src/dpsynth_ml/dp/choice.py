"""Which clipping engine a finetune uses: book-keeping wherever it is exact, the opacus hooks
engine for the layers it does not support.

Both release the same mechanism (per-unit clipping to C, one noise draw per step, division
by the expected batch size; see :mod:`dpsynth_ml.dp.engine` and
:mod:`dpsynth_ml.dp.bookkeeping`), so the choice changes cost, not privacy. Rules:

* ``bookkeeping`` when every trainable parameter is in a layer it supports exactly
  (:func:`~dpsynth_ml.dp.bookkeeping.unsupported_parameters` is empty). Every unit
  structure (K draws per example, subjects split across micro-batches) is exact in both
  engines, so the unit does not enter the choice.
* ``hooks`` otherwise: for any trainable layer book-keeping does not support.

Measured (``benchmarks/dp_overhead.py``, engine rows, ``small`` preset, batch 16, 7
interleaved pairs; docs/benchmarks.md): book-keeping is the faster and leaner engine for
every trainable set on the CPU, ``attention`` included (1.17x time and 1.17x memory of the
non-DP step against the hooks engine's 1.30x and 1.25x; ``full`` 2.25x / 1.41x against
3.50x / 3.50x; ``lora`` 1.09x against 1.16x). The hooks engine was first kept for
``attention`` on the expectation that opacus' per-example gradients of a few Linear layers
cost nothing; the measurement says otherwise. No GPU has measured the two yet
(``scripts/device_check.sh``); a GPU where hooks win for a set would re-introduce a per-set
rule here.

The choice is recorded in the model's metadata (``extra["dp_engine"]``).
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from dpsynth_ml.dp.bookkeeping import unsupported_parameters

EngineKind = Literal["bookkeeping", "hooks"]


def choose_engine(module: nn.Module) -> EngineKind:
    """The engine for ``module`` with its current trainable parameters (whatever trainable
    set selected them: the rule depends only on their layers, see the module docstring)."""
    return "hooks" if unsupported_parameters(module) else "bookkeeping"
