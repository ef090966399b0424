"""Run one DP finetune on several devices: this process is rank 0, the others are spawned.

The caller (the worker's runner) keeps everything that talks to the platform in its own
process: its hooks (leases, cancellation, heartbeats, checkpoints, private statistics) are
used by rank 0 only, and their answers are broadcast to the other ranks
(:class:`dpsynth_ml.parallel.distributed.RankHooks`). Ranks 1..W-1 are fresh processes that train
the same spec on their own shards with their own OS-seeded generators and write nothing.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from dpsynth_ml.parallel.distributed import Placement, free_port, start_rank, stop_rank
from dpsynth_ml.spec import TrainingResult, TrainingSpec
from dpsynth_ml.training.entry import train
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks

T = TypeVar("T")


def train_on_ranks(devices: Sequence[torch.device], spec: TrainingSpec, *,
                   dataset_path: Path, out_dir: Path, hooks: TrainingHooks = NullHooks(),
                   base_model_dir: Path | None = None, resume_from: Path | None = None,
                   timeout_s: float = 600.0,
                   _test_seed: int | None = None) -> TrainingResult:
    """:func:`dpsynth_ml.train` on ``len(devices)`` ranks, rank r on ``devices[r]``.

    Args:
        devices: one per rank (see :func:`dpsynth_ml.parallel.distributed.parse_devices`); a single
            device is a plain single-process run on it.
        timeout_s: how long a collective may wait for a rank (a dead rank makes the others
            fail after this long instead of hanging).
        _test_seed: tests only: rank r's generator is seeded with ``_test_seed + r``.
        Others: as for :func:`dpsynth_ml.train`; only rank 0 uses ``hooks`` and writes to
        ``out_dir``.

    Raises:
        RuntimeError: if a spawned rank fails (after rank 0 finished or failed).
    """
    world = len(devices)
    if world == 0:
        raise ValueError("no device given")
    generator = (torch.Generator().manual_seed(_test_seed) if _test_seed is not None
                 else None)
    if world == 1:
        return dataclasses.replace(
            train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                  base_model_dir=base_model_dir, resume_from=resume_from,
                  placement=Placement(device=devices[0]), _test_generator=generator),
            device=str(devices[0]))
    port = free_port()

    def lead(placement: Placement) -> TrainingResult:
        return train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                     base_model_dir=base_model_dir, resume_from=resume_from,
                     placement=placement, _test_generator=generator)

    result = lead_ranks(devices, lead, target=_follow, follower_args=lambda rank: (
        rank, world, str(devices[rank]), port, spec, str(dataset_path), base_model_dir,
        resume_from, timeout_s, None if _test_seed is None else _test_seed + rank),
        port=port, timeout_s=timeout_s, name="dpsynth-rank")
    return dataclasses.replace(result, device=str(devices[0]), world_size=world)


def lead_ranks(devices: Sequence[torch.device], lead: Callable[[Placement], T], *,
               target: Callable[..., None], follower_args: Callable[[int], tuple[Any, ...]],
               port: int, timeout_s: float, name: str) -> T:
    """Spawn ranks 1..W-1 (``target(*follower_args(rank))``, fresh processes: never a fork of
    a process holding CUDA or threads), join this process to the group as rank 0 and run
    ``lead`` on its placement; then wait for the followers.

    A failure of rank 0 terminates the followers; a follower that fails (or outlives
    ``timeout_s`` after rank 0 finished) fails the whole run.

    Raises:
        RuntimeError: if a spawned rank fails.
    """
    world = len(devices)
    context = multiprocessing.get_context("spawn")
    followers = [context.Process(target=target, name=f"{name}-{rank}",
                                 args=follower_args(rank)) for rank in range(1, world)]
    for process in followers:
        process.start()
    try:
        placement = start_rank(0, world, devices[0], port=port, timeout_s=timeout_s)
        try:
            result = lead(placement)
        finally:
            stop_rank()
    except BaseException:
        for process in followers:
            process.terminate()
        for process in followers:
            process.join()
        raise
    for process in followers:
        process.join(timeout=timeout_s)
    failed = [p.name for p in followers if p.exitcode != 0]
    for process in followers:
        if process.is_alive():
            process.terminate()
            process.join()
    if failed:
        raise RuntimeError(f"ranks failed: {', '.join(failed)}")
    return result


def _follow(rank: int, world: int, device: str, port: int, spec: TrainingSpec,
            dataset_path: str, base_model_dir: Path | None, resume_from: Path | None,
            timeout_s: float, seed: int | None) -> None:
    """A spawned rank: same spec, own shard and generator, no hooks of its own."""
    placement = start_rank(rank, world, torch.device(device), port=port, timeout_s=timeout_s)
    try:
        # a rank > 0 writes nothing; train() still wants a directory of its own
        with tempfile.TemporaryDirectory(prefix=f"dpsynth-rank-{rank}-") as scratch:
            train(spec, dataset_path=Path(dataset_path), out_dir=Path(scratch),
                  hooks=NullHooks(), base_model_dir=base_model_dir, resume_from=resume_from,
                  placement=placement,
                  _test_generator=None if seed is None else torch.Generator().manual_seed(seed))
    finally:
        stop_rank()
