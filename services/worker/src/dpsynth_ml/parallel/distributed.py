"""Where the ML core runs: a torch device, and for multi-GPU jobs the rank's process group.

A job on W GPUs of one node runs as W processes (ranks 0..W-1), rank r on ``cuda:r``, joined
by a torch.distributed process group (backend ``nccl`` on GPUs, ``gloo`` on CPU). The DP
arithmetic across ranks is in :mod:`dpsynth_ml.dp.distributed`; this module only resolves
devices and starts or ends the group. A single-process job has ``Placement()`` (rank 0 of
1) on ``cpu`` or one ``cuda`` device and needs no process group.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dpsynth_ml.training.hooks import TrainingHooks

if TYPE_CHECKING:
    from dpsynth_ml.spec import CentralImages


@dataclass(frozen=True)
class Placement:
    """One rank of a job: which rank, of how many, on which device.

    Attributes:
        rank: 0..world_size-1; rank 0 owns leases, checkpoints and the model it releases.
        world_size: W, the number of processes training the one model.
        device: where this rank's model copy and per-example gradients live.
    """

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"


def parse_devices(text: str) -> list[torch.device]:
    """Devices from a setting such as ``cpu``, ``cuda``, ``cuda:0,cuda:1`` or ``cuda:all``.

    ``cuda`` is one GPU (``cuda:0``); ``cuda:all`` is every visible GPU. The job runs one
    rank per listed device, so a list of W devices is a world of size W.

    Raises:
        ValueError: an empty or unknown entry, a GPU that is not visible, a repeated device,
            or CPU mixed with GPUs.
    """
    entries = [e.strip().lower() for e in text.split(",") if e.strip()]
    if not entries:
        raise ValueError("no device given")
    devices: list[torch.device] = []
    for entry in entries:
        if entry == "cuda:all":
            count = torch.cuda.device_count()
            if count == 0:
                raise ValueError("cuda:all but no GPU is visible")
            devices.extend(torch.device("cuda", i) for i in range(count))
            continue
        try:
            device = torch.device(entry)
        except RuntimeError as exc:
            raise ValueError(f"unknown device {entry!r}") from exc
        if device.type == "cuda":
            index = 0 if device.index is None else device.index
            if index >= torch.cuda.device_count():
                raise ValueError(f"{entry} is not a visible GPU "
                                 f"({torch.cuda.device_count()} visible)")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise ValueError(f"unsupported device type {device.type!r}")
        devices.append(device)
    if len(set(devices)) != len(devices) and any(d.type == "cuda" for d in devices):
        raise ValueError("a GPU is listed twice")
    if len({d.type for d in devices}) > 1:
        raise ValueError("CPU and GPUs cannot be mixed in one job")
    return devices


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (for a single-node rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_rank(rank: int, world_size: int, device: torch.device, *, port: int,
               host: str = "127.0.0.1", timeout_s: float = 300.0) -> Placement:
    """Join this process to the job's process group as ``rank`` (collective: every rank).

    Sets the current CUDA device first, so NCCL binds each rank to its own GPU.
    """
    placement = Placement(rank=rank, world_size=world_size, device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=placement.backend, init_method=f"tcp://{host}:{port}",
                            rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return placement


def broadcast_int(placement: Placement, value: int) -> int:
    """Rank 0's ``value`` on every rank (collective); ``value`` itself when W = 1."""
    if not placement.distributed:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=placement.device)
    dist.broadcast(box, src=0)
    return int(box.item())


def broadcast_flag(placement: Placement, flag: bool) -> bool:
    """Rank 0's decision on every rank (collective); ``flag`` itself when W = 1."""
    return bool(broadcast_int(placement, int(flag)))


def same_on_all_ranks(placement: Placement, values: list[float]) -> bool:
    """Whether every rank passed the same ``values`` (collective; True when W = 1)."""
    if not placement.distributed:
        return True
    mine = torch.tensor([float(len(values)), *values], dtype=torch.float64,
                        device=placement.device)
    size = mine[:1].clone()
    low_size, high_size = size.clone(), size.clone()
    dist.all_reduce(low_size, op=dist.ReduceOp.MIN)
    dist.all_reduce(high_size, op=dist.ReduceOp.MAX)
    if not torch.equal(low_size, high_size):
        return False
    low, high = mine.clone(), mine.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(torch.equal(low, high))


def stop_rank() -> None:
    """Leave the process group (no-op when none was started)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class RankHooks:
    """The job's :class:`~dpsynth_ml.training.hooks.TrainingHooks` as seen by one rank.

    Only rank 0 talks to the platform (leases, cancellation, progress, checkpoints, private
    statistics). Its answers to :meth:`acquire_steps` and :meth:`should_stop` are broadcast,
    so every rank runs exactly the steps rank 0 was granted: each step is a collective, and
    the ledger charges what rank 0 leased. Every method is collective where it answers or
    aggregates: all ranks must call it at the same point of the loop.
    """

    def __init__(self, hooks: TrainingHooks, placement: Placement) -> None:
        self._hooks = hooks
        self._placement = placement

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        granted = (int(self._hooks.acquire_steps(start, count, partition))
                   if self._placement.is_main else 0)
        return broadcast_int(self._placement, granted)

    def charge_release(self, release: CentralImages) -> None:
        """Rank 0 charges (it alone draws the release); the other ranks never call this
        (:mod:`dpsynth_ml.warmup.stage` tells them the outcome) and charge nothing."""
        if self._placement.is_main:
            self._hooks.charge_release(release)

    def should_stop(self) -> bool:
        stop = bool(self._hooks.should_stop()) if self._placement.is_main else False
        return broadcast_flag(self._placement, stop)

    def on_progress(self, step: int, total: int) -> None:
        if self._placement.is_main:
            self._hooks.on_progress(step, total)

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        if self._placement.is_main:
            self._hooks.on_checkpoint(step, checkpoint_dir)

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        """Sum the ranks' counts, clipped counts and loss sums; rank 0 reports the result."""
        units = float(stats.get("batch_size", 0.0))
        examples = float(stats.get("images", units))
        local = torch.tensor([units, examples, stats.get("fraction_clipped", 0.0) * units,
                              stats.get("loss", 0.0) * examples], dtype=torch.float64,
                             device=self._placement.device)
        dist.all_reduce(local, op=dist.ReduceOp.SUM)
        if not self._placement.is_main:
            return
        units, examples, clipped, loss_sum = (float(v) for v in local.tolist())
        merged = {"batch_size": units, "fraction_clipped": clipped / units if units else 0.0}
        if "images" in stats:
            merged["images"] = examples
        if examples:
            merged["loss"] = loss_sum / examples
        self._hooks.on_private_stats(merged)


RESIDENT_MAX_BYTES = 4 * 2**30
"""The encoded private examples stay on an accelerator up to this size (the ``base`` preset's
50,000 latents of 4x32x32 floats take 0.8 GB); larger sets are gathered on the host and each
micro-batch is copied over (issue 18: no host-device copies in the inner loop where the
data fits)."""


def resident(tensor: torch.Tensor, device: torch.device,
             max_bytes: int = RESIDENT_MAX_BYTES) -> torch.Tensor:
    """``tensor`` where the DP loop will gather its rows: on ``device`` when that is an
    accelerator and the tensor takes at most ``max_bytes``, on the host otherwise."""
    if device.type == "cpu" or tensor.numel() * tensor.element_size() > max_bytes:
        return tensor.cpu()
    return tensor.to(device)
