"""Trainer state of a checkpoint: step, DP parameters, optimizer, EMA and LR schedule.

A finetune checkpoint directory is a model directory (holding the *released* weights: the
EMA when ``ema_decay`` is set) plus::

    trainer_state.json       step, DP parameters, EMA counters, LR-schedule state
    optimizer.safetensors    per-parameter optimizer state keyed by trainable-parameter name
    trainable.safetensors    the raw (non-averaged) trainable weights, to resume from
    ema.safetensors          the EMA of the trainable weights (only with ``ema_decay``)
    central_images.npz       the released central images (only with ``central_images``)

The RNG state is deliberately *not* saved: DP noise and Poisson sampling are never restored
or replayed on resume (docs/privacy.md), so every attempt's steps are fresh releases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
TRAINABLE_FILE = "trainable.safetensors"
EMA_FILE = "ema.safetensors"


def write_trainer_state(checkpoint_dir: Path, state: Mapping[str, Any]) -> None:
    """Write ``trainer_state.json`` (JSON floats round-trip exactly in Python)."""
    path = Path(checkpoint_dir) / STATE_FILE
    path.write_text(json.dumps(dict(state), indent=2, sort_keys=True))


def read_trainer_state(checkpoint_dir: Path) -> dict[str, Any]:
    """Read ``trainer_state.json`` of a checkpoint directory."""
    state: dict[str, Any] = json.loads((Path(checkpoint_dir) / STATE_FILE).read_text())
    return state


def save_optimizer_state(optimizer: Optimizer, names: Sequence[str], checkpoint_dir: Path) -> None:
    """Save the per-parameter optimizer state keyed by parameter name (safetensors).

    Args:
        optimizer: a single-param-group optimizer (Adam/AdamW) over ``names``' parameters.
        names: parameter names in optimizer order.
        checkpoint_dir: destination directory.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tensors: dict[str, torch.Tensor] = {}
    for name, param in zip(names, params, strict=True):
        for key, value in optimizer.state.get(param, {}).items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{name}::{key}"] = tensor.detach().cpu().contiguous()
    save_file(tensors, str(Path(checkpoint_dir) / OPTIMIZER_FILE))


def load_optimizer_state(optimizer: Optimizer, names: Sequence[str], checkpoint_dir: Path) -> None:
    """Restore what :func:`save_optimizer_state` wrote into a fresh optimizer.

    Raises:
        ValueError: if the checkpoint's parameter names differ from ``names``.
    """
    tensors = load_file(str(Path(checkpoint_dir) / OPTIMIZER_FILE))
    saved_names = {key.split("::", 1)[0] for key in tensors}
    if saved_names and saved_names != set(names):
        raise ValueError("checkpoint optimizer state is for different trainable parameters")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for name, param in zip(names, params, strict=True):
        prefix = f"{name}::"
        entry = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if entry:
            optimizer.state[param] = entry


def save_named_tensors(tensors: Sequence[torch.Tensor], names: Sequence[str], path: Path) -> None:
    """Save ``tensors`` keyed by ``names`` (e.g. trainable weights, EMA) as safetensors."""
    payload = {name: t.detach().cpu().contiguous().clone()
               for name, t in zip(names, tensors, strict=True)}
    save_file(payload, str(path))


def load_named_tensors(names: Sequence[str], path: Path) -> list[torch.Tensor]:
    """Load what :func:`save_named_tensors` wrote, in the order of ``names``.

    Raises:
        ValueError: if the file holds different names.
    """
    tensors = load_file(str(path))
    if set(tensors) != set(names):
        raise ValueError(f"{Path(path).name} is for different trainable parameters")
    return [tensors[name] for name in names]


def warmup_schedule(optimizer: Optimizer, warmup_steps: int) -> LambdaLR:
    """Linear learning-rate warm-up over logical steps, then constant.

    Logical step s (0-based) runs at ``lr * min(1, (s + 1) / warmup_steps)``: the first step
    already moves (a step at lr 0 would spend privacy budget for nothing) and step
    ``warmup_steps - 1`` reaches the full rate. Call ``step()`` once per logical step.
    """
    def factor(step: int) -> float:
        return 1.0 if warmup_steps <= 0 else min(1.0, (step + 1) / warmup_steps)

    return LambdaLR(optimizer, factor)


def schedule_state(schedule: LambdaLR) -> dict[str, Any]:
    """The JSON-serialisable state of a :func:`warmup_schedule` (its lambda is code)."""
    state = schedule.state_dict()
    state.pop("lr_lambdas", None)
    return {k: v for k, v in state.items() if isinstance(v, (int, float, bool, list))}


def restore_schedule(schedule: LambdaLR, state: Mapping[str, Any]) -> None:
    """Restore :func:`schedule_state` and set the optimizer's current learning rates."""
    schedule.load_state_dict({**schedule.state_dict(), **dict(state)})
    for group, lr in zip(schedule.optimizer.param_groups, schedule.get_last_lr(), strict=True):
        group["lr"] = lr
