"""What the book-keeping engine can take: the trainable parameters it clips exactly, and the
error for a module it cannot (the hooks engine takes those; :mod:`dpsynth_ml.dp.choice`)."""

from __future__ import annotations

from torch import nn

from dpsynth_ml.dp.bookkeeping.layers import _layer_problem


class UnsupportedModuleError(ValueError):
    """The module has a trainable parameter the book-keeping engine cannot clip exactly."""


def unsupported_parameters(module: nn.Module) -> list[str]:
    """Names of trainable parameters the book-keeping engine cannot clip exactly (empty
    when it can take the whole module); see the package docstring for the rules."""
    owners: dict[int, int] = {}
    problems: list[str] = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            owners[id(p)] = owners.get(id(p), 0) + 1
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            reason = _layer_problem(mod, p_name)
            if reason:
                problems.append(f"{full} ({reason})")
    for name, p in module.named_parameters(remove_duplicate=False):
        if p.requires_grad and owners.get(id(p), 0) > 1:
            problems.append(f"{name} (shared by {owners[id(p)]} layers)")
    return sorted(set(problems))
