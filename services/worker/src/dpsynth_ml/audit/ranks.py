"""An audit on W ranks: the audited finetune's distributed mechanism, not a one-rank copy.

A finetune placed on W devices (``DPSYNTH_WORKER_DEVICES``, :mod:`dpsynth_ml.parallel.ranks`)
releases each step as W shards' clipped sums, all-reduced, plus ONE noise draw by rank 0
(:mod:`dpsynth_ml.dp.distributed`). A bug there (noise on every rank, or on none; a shard
sampled at the wrong rate; a sum divided by a per-rank size) is a bug of that mechanism
alone, so its audit runs on the same W ranks: this process is rank 0 and W - 1 ranks are
spawned, exactly as :func:`dpsynth_ml.parallel.ranks.train_on_ranks` runs a finetune.

* white box (:func:`dpsynth_ml.audit.finetune.audit_finetune` with a ``placement``): each
  rank samples its shard of the stand-in with its own generator; rank 0 alone adds the
  gradient canaries (its units, each Poisson-sampled at q) and reads the released gradient.
* black box (:func:`dpsynth_ml.audit.blackbox.black_box_audit_rank`): every rank builds the
  same training set from a seed rank 0 draws and passes on, the ranks train it as a
  W-rank finetune, and rank 0 scores the canaries on the model it wrote.

Only rank 0's result is returned; the other ranks write nothing and keep no model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from dpsynth_ml.audit.blackbox import (
    SCORE_DRAWS,
    BlackBoxAudit,
    black_box_audit_rank,
    draw_set_seed,
)
from dpsynth_ml.audit.finetune import audit_finetune
from dpsynth_ml.audit.whitebox import WhiteBoxAudit
from dpsynth_ml.parallel.distributed import Placement, free_port, start_rank, stop_rank
from dpsynth_ml.parallel.placement import resolve_devices
from dpsynth_ml.parallel.ranks import lead_ranks
from dpsynth_ml.spec import FinetuneTraining
from dpsynth_ml.training.entry import placeable

AuditMode = Literal["white_box", "black_box"]


def audit_placed(mode: AuditMode, setting: str, spec: FinetuneTraining,
                 **kwargs: Any) -> WhiteBoxAudit | BlackBoxAudit:
    """:func:`audit_on_ranks` on the devices the audited finetune ran on under the worker's
    ``DEVICES`` ``setting`` (:func:`dpsynth_ml.parallel.placement.train_placed`): a
    whole-dataset finetune on every listed device, a per-label one on the first."""
    return audit_on_ranks(mode, audit_devices(setting, spec), spec, **kwargs)


def audit_devices(setting: str, spec: FinetuneTraining) -> list[torch.device]:
    """Where :func:`audit_placed` runs ``spec``'s audit: one rank per device its finetune
    used (``train_placed``'s rule)."""
    devices = resolve_devices(setting)
    return devices if placeable(spec) else devices[:1]


def audit_on_ranks(mode: AuditMode, devices: Sequence[torch.device], spec: FinetuneTraining,
                   *, dataset_path: Path, base_model_dir: Path, canaries: int, delta: float,
                   generator: torch.Generator, confidence: float = 0.95,
                   claimed_mu: float | None = None, tail_delta: float = 0.0,
                   audited_class: str | None = None, seeded_noise: bool = False,
                   timeout_s: float = 600.0,
                   _test_seed: int | None = None) -> WhiteBoxAudit | BlackBoxAudit:
    """The ``mode`` audit of ``spec`` on ``len(devices)`` ranks, rank r on ``devices[r]``.

    Args:
        mode: ``white_box`` (gradient canaries) or ``black_box`` (loss canaries).
        devices: one per rank; one device is the plain one-rank audit on it.
        generator: rank 0's (the canaries, its shard, the scoring draws).
        timeout_s: how long a collective may wait for a rank.
        _test_seed: tests only: rank r > 0 samples its shard from ``_test_seed + r``
            (None: from the OS).
        Others: as for :func:`dpsynth_ml.audit_finetune` /
        :func:`dpsynth_ml.black_box_audit_finetune`.

    Raises:
        RuntimeError: if a spawned rank fails.
    """
    world = len(devices)
    if world == 0:
        raise ValueError("no device given")
    options: dict[str, Any] = {
        "canaries": canaries, "delta": delta, "confidence": confidence,
        "claimed_mu": claimed_mu, "tail_delta": tail_delta, "audited_class": audited_class,
        "seeded_noise": seeded_noise}
    if mode == "black_box":
        options["set_seed"] = draw_set_seed(generator) if world > 1 else None
    if world == 1:
        return dataclasses.replace(
            _audit(mode, spec, dataset_path, base_model_dir, generator,
                   Placement(device=devices[0]), options), device=str(devices[0]))
    port = free_port()
    result = lead_ranks(
        devices, lambda placement: _audit(mode, spec, dataset_path, base_model_dir,
                                          generator, placement, options),
        target=_follow, follower_args=lambda rank: (
            mode, rank, world, str(devices[rank]), port, spec, str(dataset_path),
            str(base_model_dir), options, timeout_s,
            None if _test_seed is None else _test_seed + rank),
        port=port, timeout_s=timeout_s, name="dpsynth-audit-rank")
    return dataclasses.replace(result, device=str(devices[0]), world_size=world)


def _audit(mode: AuditMode, spec: FinetuneTraining, dataset_path: Path, base_model_dir: Path,
           generator: torch.Generator, placement: Placement,
           options: dict[str, Any]) -> WhiteBoxAudit | BlackBoxAudit:
    result = _rank(mode, spec, dataset_path, base_model_dir, generator, placement, options)
    assert result is not None  # rank 0
    return result


def _rank(mode: AuditMode, spec: FinetuneTraining, dataset_path: Path, base_model_dir: Path,
          generator: torch.Generator, placement: Placement,
          options: dict[str, Any]) -> WhiteBoxAudit | BlackBoxAudit | None:
    if mode == "white_box":
        white = {k: v for k, v in options.items() if k != "set_seed"}
        return audit_finetune(spec, dataset_path=dataset_path, base_model_dir=base_model_dir,
                              generator=generator, placement=placement, **white)
    return black_box_audit_rank(spec, dataset_path=dataset_path,
                                base_model_dir=base_model_dir, generator=generator,
                                placement=placement, draws=SCORE_DRAWS, **options)


def _follow(mode: AuditMode, rank: int, world: int, device: str, port: int,
            spec: FinetuneTraining, dataset_path: str, base_model_dir: str,
            options: dict[str, Any], timeout_s: float, seed: int | None) -> None:
    """A spawned rank: the same audit on its own shard and generator; its result is dropped."""
    placement = start_rank(rank, world, torch.device(device), port=port, timeout_s=timeout_s)
    generator = torch.Generator().manual_seed(
        seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    try:
        _rank(mode, spec, Path(dataset_path), Path(base_model_dir), generator, placement,
              options)
    finally:
        stop_rank()
