"""Trainer state of a checkpoint: step, DP parameters and optimizer state (safetensors).

The RNG state is deliberately *not* saved: DP noise and Poisson sampling are never restored
or replayed on resume (DESIGN §3), so every attempt's steps are fresh releases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch.optim import Optimizer

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"


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
