"""DP-SGD for one job on W ranks (torch.distributed): the same mechanism as one process.

One logical step of the single-process engine releases

    g = (sum_{i in B} clip_C(g_i) + N(0, sigma^2 C^2 I)) / E,     B ~ Poisson(q) over N records,

with E the spec's expected batch size (q * N). On W ranks:

* Sampling: rank r owns the disjoint shard ``r, r + W, r + 2W, ...`` of the N records
  (:class:`ShardedPoissonSampler`; subjects for user-level DP,
  :class:`ShardedSubjectPoissonSampler`) and includes each record of its shard
  independently with probability exactly q, from its own generator. Every record is in one
  shard, so the union over ranks includes each record independently with probability q:
  it IS a Poisson sample of the whole dataset at rate q, and the accountant's (q, sigma,
  steps) are unchanged. A rank's sample may be empty; it still takes part in the step.
* Clipping: each rank clips its own examples' gradients to C (the single-process code).
* Aggregation: the clipped sums are added over ranks with one all-reduce (SUM).
* Noise: N(0, sigma^2 C^2 I) is drawn ONCE per step, by rank 0 only, before the all-reduce
  (opacus ``DistributedDPOptimizer.add_noise``), from rank 0's engine's ChaCha20 noise
  source (:mod:`dpsynth_ml.dp.noise`, a fresh OS key per rank and attempt) on rank 0's
  device; the other ranks add nothing. Noise on every
  rank would make the std sigma * C * sqrt(W) (more noise, a different mechanism from the
  one accounted); one shared noise draw is what keeps the guarantee equal.
* Normalisation: the reduced sum is divided once by the GLOBAL expected batch size E, never
  by a per-rank size and never again by W.

opacus pieces used and not used (opacus 1.6.0):

* used: ``GradSampleModule`` and ``DPOptimizer`` clipping (through :class:`DpSgdEngine`);
  ``DistributedDPOptimizer.add_noise`` (noise on rank 0 only).
* not used: ``DistributedDPOptimizer.reduce_gradients`` (one all-reduce per parameter, and
  with ``loss_reduction="mean"`` it divides by W on top of ``scale_grad``'s division by a
  PER-WORKER expected batch size; correct only if the caller passed E / W, which
  ``PrivacyEngine`` does but a direct caller easily gets wrong). Here the engine runs with
  ``loss_reduction="sum"``, reduces all gradients in one flat buffer and divides by E itself.
* not used: ``DistributedUniformWithReplacementSampler`` (it skips empty local batches, so a
  rank with an empty sample would not join the step's all-reduce and the step count would
  differ from the accounted one; it compares float32 uniforms with q, which rounds q; and
  its ``int(1 / q)`` batches per epoch are not the accounted step count).
* not used: ``DifferentiallyPrivateDistributedDataParallel`` (it only broadcasts the
  parameters from rank 0 and wraps the module; :class:`DistributedDpSgdEngine` does the
  broadcast, of buffers too, without changing the module hierarchy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from opacus.optimizers import DistributedDPOptimizer
from opacus.optimizers.optimizer import DPOptimizer
from torch import nn
from torch.optim import Optimizer

from dpsynth_ml.dp.bookkeeping import BookKeepingEngine, NormMode
from dpsynth_ml.dp.engine import DpSgdEngine, SourcedNoiseDPOptimizer, set_grad_sample
from dpsynth_ml.dp.noise import NoiseSource
from dpsynth_ml.dp.sampler import PoissonSampler, SubjectBatch, SubjectPoissonSampler
from dpsynth_ml.parallel.distributed import Placement, same_on_all_ranks


def shard_of(num_records: int, rank: int, world_size: int) -> torch.Tensor:
    """The indices rank ``rank`` of ``world_size`` owns: ``rank, rank + W, ...`` (< N)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    return torch.arange(rank, num_records, world_size, dtype=torch.long)


class ShardedPoissonSampler:
    """One rank's part of a Poisson sample at rate q over N records.

    Each call to :meth:`sample` must be made by every rank once per logical step (with
    independent generators); the union of the ranks' batches is then distributed exactly as
    ``PoissonSampler(N, q).sample()``.

    Attributes:
        num_records: N, the whole dataset (what q is relative to).
        sample_rate: q, exactly as accounted by the ledger.
        shard: the global indices this rank may draw.
    """

    def __init__(self, num_records: int, sample_rate: float, generator: torch.Generator, *,
                 rank: int, world_size: int, public_size: int | None = None) -> None:
        self.num_records = num_records
        self.sample_rate = sample_rate
        self.shard = shard_of(num_records, rank, world_size)
        # public_size: this rank's public shard size ceil(N̂ / W) (uniforms drawn per step)
        self._inner = PoissonSampler(int(self.shard.numel()), sample_rate, generator,
                                     public_size=public_size)

    @property
    def draws(self) -> int:
        return self._inner.draws

    def sample(self) -> torch.Tensor:
        """Global indices (int64, ascending) of this rank's part of the next batch."""
        return self.shard[self._inner.sample()]


class ShardedSubjectPoissonSampler:
    """One rank's part of a user-level (subject) Poisson sample at rate q.

    Subjects, not images, are sharded (rank r owns subjects ``r, r + W, ...``), so all of a
    subject's images are on one rank and its one contribution is clipped once there.

    Attributes:
        num_records: S, all subjects (what q is relative to).
        sample_rate: q.
        max_images_per_subject: the per-subject image cap.
    """

    def __init__(self, subjects: np.ndarray | torch.Tensor, num_subjects: int,
                 sample_rate: float, generator: torch.Generator, *, rank: int,
                 world_size: int, max_images_per_subject: int,
                 public_size: int | None = None) -> None:
        subjects = torch.as_tensor(np.asarray(subjects), dtype=torch.long).flatten()
        shard_of(num_subjects, rank, world_size)  # validates rank / world_size
        self.num_records = num_subjects
        self.sample_rate = sample_rate
        self.max_images_per_subject = max_images_per_subject
        self._rank, self._world = rank, world_size
        own = subjects % world_size == rank
        self._images = own.nonzero(as_tuple=False).flatten()
        local_count = len(range(rank, num_subjects, world_size))
        self._inner = SubjectPoissonSampler(subjects[own] // world_size, local_count,
                                            sample_rate, generator,
                                            max_images_per_subject=max_images_per_subject,
                                            public_size=public_size)

    @property
    def draws(self) -> int:
        return self._inner.draws

    def sample(self) -> SubjectBatch:
        """This rank's part of the next batch, in global image and subject indices."""
        batch = self._inner.sample()
        return SubjectBatch(self._images[batch.indices], batch.groups, batch.counts,
                            batch.subjects * self._world + self._rank)


class _RankZeroNoiseOptimizer(DistributedDPOptimizer,  # type: ignore[misc]  # opacus
                              SourcedNoiseDPOptimizer):
    """opacus' rank-0-only noise (``DistributedDPOptimizer.add_noise``) drawn from the
    engine's noise source (``SourcedNoiseDPOptimizer.add_noise``, next in the MRO)."""


class DistributedDpSgdEngine(DpSgdEngine):
    """:class:`DpSgdEngine` for one rank of a W-rank job (same arguments, same methods).

    ``expected_batch_size`` is the GLOBAL expected batch size E (the spec's, q * N), the
    same number a single process uses. The noise is drawn on rank 0 only, from its engine's
    own OS-keyed ChaCha20 source; ``generator`` and ``_test_noise`` are for tests only, as in
    :class:`DpSgdEngine` (give every rank its own, as its sampler and diffusion draws must
    differ between ranks).

    Construction is collective: it checks that all ranks were given the same sigma, C, E
    and parameter shapes, and copies rank 0's parameters and buffers to every rank. Every
    rank must then call :meth:`privatize` once per logical step, also with an empty sample.

    Raises:
        RuntimeError: if torch.distributed is not initialised, or the ranks disagree.
    """

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator | None = None,
                 _test_noise: NoiseSource | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedDpSgdEngine needs an initialised process group")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.expected_batch_size = expected_batch_size
        super().__init__(module, optimizer, noise_multiplier=noise_multiplier,
                         max_grad_norm=max_grad_norm, expected_batch_size=expected_batch_size,
                         generator=generator, _test_noise=_test_noise)
        self._check_same_settings(noise_multiplier, max_grad_norm, expected_batch_size)
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def _dp_optimizer(self, optimizer: Optimizer, *, noise_multiplier: float,
                      max_grad_norm: float, expected_batch_size: int,
                      noise_source: NoiseSource) -> DPOptimizer:
        # loss_reduction="sum": no per-rank scaling; privatize() divides by the global E.
        return _RankZeroNoiseOptimizer(optimizer, noise_multiplier=noise_multiplier,
                                       max_grad_norm=max_grad_norm,
                                       expected_batch_size=expected_batch_size,
                                       loss_reduction="sum", noise_source=noise_source)

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def _check_same_settings(self, sigma: float, clip: float, expected: int) -> None:
        shapes = [float(n) for p in self.params for n in (p.numel(), p.dim())]
        placement = Placement(rank=self.rank, world_size=self.world_size, device=self.device)
        if not same_on_all_ranks(placement, [sigma, clip, float(expected), *shapes]):
            raise RuntimeError("the ranks disagree on noise multiplier, clipping norm, "
                               "expected batch size or trainable parameter shapes")

    def privatize(self) -> None:
        """Finish a logical step on all ranks (collective): add this rank's clipped sum to
        the others', noise once (rank 0), divide by the global E; leaves it in ``p.grad``,
        identical on every rank."""
        if self._carried is not None:
            raise RuntimeError("a subject's contribution was carried but never completed")
        for p in self.params:
            set_grad_sample(p, torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device))
        # clip (nothing left) -> add_noise: rank 0 sum + noise, others sum -> no scaling
        if not self.optimizer.pre_step():
            raise RuntimeError("DPOptimizer skipped the noise step unexpectedly")
        _all_reduce_sum([p.grad for p in self.params])  # type: ignore[misc]
        for p in self.params:
            assert p.grad is not None
            p.grad.div_(self.expected_batch_size)

    def parameters_in_sync(self) -> bool:
        """Whether every rank holds the same trainable parameters (collective, for checks)."""
        return _in_sync(self.params)


class DistributedBookKeepingEngine(BookKeepingEngine):
    """:class:`BookKeepingEngine` for one rank of a W-rank job: the mechanism of
    :class:`DistributedDpSgdEngine` (same arguments, same collective construction and
    :meth:`privatize`), with book-keeping clipping on each rank.

    Each rank clips its own units exactly (a subject's images are all on one rank), rank 0
    alone adds N(0, sigma^2 C^2 I) from its own noise source to its clipped sum, one
    all-reduce (SUM) adds the ranks' sums, and the result is divided by the GLOBAL expected
    batch size E on every rank.

    Raises:
        RuntimeError: if torch.distributed is not initialised, or the ranks disagree.
    """

    def __init__(self, module: nn.Module, optimizer: Optimizer, *, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator | None = None,
                 _test_noise: NoiseSource | None = None, norm_mode: NormMode = "auto") -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedBookKeepingEngine needs an initialised process "
                               "group")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        super().__init__(module, optimizer, noise_multiplier=noise_multiplier,
                         max_grad_norm=max_grad_norm, expected_batch_size=expected_batch_size,
                         generator=generator, _test_noise=_test_noise, norm_mode=norm_mode)
        shapes = [float(n) for p in self.params for n in (p.numel(), p.dim())]
        placement = Placement(rank=self.rank, world_size=self.world_size, device=self.device)
        if not same_on_all_ranks(placement, [noise_multiplier, max_grad_norm,
                                             float(expected_batch_size), *shapes]):
            raise RuntimeError("the ranks disagree on noise multiplier, clipping norm, "
                               "expected batch size or trainable parameter shapes")
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def _release(self, sums: list[torch.Tensor]) -> list[torch.Tensor]:
        """Rank 0's sum + the one noise draw, the other ranks' sums, added over ranks."""
        out = self._noised(sums) if self.rank == 0 else [s.clone() for s in sums]
        _all_reduce_sum(out)
        return out

    def parameters_in_sync(self) -> bool:
        """Whether every rank holds the same trainable parameters (collective, for checks)."""
        return _in_sync(self.params)


def _in_sync(params: Sequence[torch.Tensor]) -> bool:
    """Whether every rank holds the same ``params`` (collective: one MIN and one MAX)."""
    flat = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(torch.equal(low, high))


def _all_reduce_sum(tensors: Sequence[torch.Tensor]) -> None:
    """Sum tensors over ranks in place with one collective (one flat buffer per dtype)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in group:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
