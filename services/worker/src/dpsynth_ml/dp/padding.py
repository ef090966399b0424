"""Fixed-cost logical steps: every step processes the same number of rows, whatever the data.

The realised Poisson batch is Binomial(n, q) with n the true number of records (or
subjects). Its size is private, and so is anything that grows with it: a step's wall time,
the time between progress reports, the job's total run time (with N = 10k, q = 0.01 and
T = 10k steps the run time alone reads N to about ±10 records). So every logical step
processes a fixed number of rows, R, computed from public quantities only: the public size
N̂ the sample rate was computed from (q = B / N̂), q, the number of steps T and the job's
(ε, δ). The realised batch is padded to R with MASKED rows whose per-example loss is
multiplied by 0, so their per-example gradient is exactly 0, their clipped contribution is
0 and the clipped sum (hence the released update) is the unpadded one; they run through the
same micro-batches, the same K diffusion draws and the same label/layout paths as real rows.
docs/privacy.md, "Progress, ETA and timing", states the semantics.

**The cap.** Since n ≤ N̂, Binomial(n, q) is stochastically dominated by Binomial(N̂, q), so
P[batch > c] ≤ sf(c; N̂, q), a public number. The cap is the smallest c with
sf(c; N̂, q) ≤ η / (T · W) (union bound over the T steps and the W ranks' shards), so
P[any step of the job overflows] ≤ η. η = 1e-3 · δ / (1 + e^ε) by default.

**Overflow.** Rows are never dropped (a truncated batch is not the analysed mechanism): a
step whose batch exceeds R processes ⌈b / R⌉ · R rows, in extra padded chunks. Only then does
a step's cost depend on the data. The real mechanism (model + timing) and an ideal one
whose steps always cost R rows coincide except on the overflow event, whose probability is
≤ η on every dataset; so for any (ε', δ') statement about the ideal mechanism the real one
satisfies (ε', δ' + (1 + e^ε') · η) (total-variation argument:
P[M(D) ∈ S] ≤ P[M*(D) ∈ S] + η ≤ e^ε' P[M*(D') ∈ S] + δ' + η ≤ e^ε' P[M(D') ∈ S] + δ'
+ (1 + e^ε') η). At the job's ε this is δ_timing = (1 + e^ε) · η = 1e-3 · δ.

**Subjects.** User-level DP-SGD caps sampled SUBJECTS the same way and processes
R = cap · max_images_per_subject image rows (each sampled subject contributes at most that
many images, so image rows overflow only when subjects do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy.stats import binom

from dpsynth_ml.spec import InvalidSpecError

#: η when the job's (ε, δ) are unknown (specs built by tests and benchmarks).
DEFAULT_OVERFLOW_BOUND = 1e-12
#: δ_timing as a fraction of the job's δ: η = TIMING_DELTA_FRACTION · δ / (1 + e^ε).
TIMING_DELTA_FRACTION = 1e-3


@dataclass(frozen=True)
class FixedBatch:
    """How many rows each logical step processes, and what the cap costs.

    Attributes:
        population: N̂ (per rank on W ranks: ⌈N̂ / W⌉), the public size the cap assumes.
        units: the cap on sampled units (records or subjects) per step (per rank).
        rows: rows processed per step when the batch fits: units × images per unit.
        overflow_bound: η, an upper bound on P[any step of the job exceeds the cap].
        delta_timing: (1 + e^ε) · η, what timing adds to the job's δ (None: ε unknown).
    """

    population: int
    units: int
    rows: int
    overflow_bound: float
    delta_timing: float | None

    def rows_for(self, realised: int) -> int:
        """Rows a step with ``realised`` rows processes: R, or ⌈realised / R⌉ · R."""
        if realised <= self.rows:
            return self.rows
        return self.rows * math.ceil(realised / self.rows)

    def record(self) -> dict[str, float | int | None]:
        """The figures for trainer state and the model's info (all public)."""
        return {"population": self.population, "units_per_step": self.units,
                "rows_per_step": self.rows, "overflow_bound": self.overflow_bound,
                "delta_timing": self.delta_timing}


MAX_PUBLIC_SIZE = 100_000_000
"""The largest public size N̂ a job may imply (the api refuses a larger declared size): the
sampler draws N̂ uniforms per step and the encoder pads to N̂ rows, both in proportion to it."""


def public_size(*, sample_rate: float, expected_batch_size: int) -> int:
    """N̂ from q = B / N̂ (the ledger computes q that way; the tiny slack absorbs rounding).

    Raises:
        InvalidSpecError: q and B imply N̂ above :data:`MAX_PUBLIC_SIZE` (a rate no dataset of the
            platform gives: every step's padded work is in proportion to N̂).
    """
    size = max(1, math.ceil(expected_batch_size / sample_rate - 1e-6))
    if size > MAX_PUBLIC_SIZE:
        raise InvalidSpecError(f"sample_rate {sample_rate:g} with expected_batch_size "
                         f"{expected_batch_size} implies a public size N̂ = {size:.3g}, above "
                         f"the largest the platform serves ({MAX_PUBLIC_SIZE:,})")
    return size


def overflow_bound(*, epsilon: float | None, delta: float | None) -> float:
    """η = 1e-3 · δ / (1 + e^ε), or :data:`DEFAULT_OVERFLOW_BOUND` when either is unknown."""
    if epsilon is None or delta is None:
        return DEFAULT_OVERFLOW_BOUND
    # 1 / (1 + e^ε) without overflow for large ε
    return TIMING_DELTA_FRACTION * delta * math.exp(-epsilon) / (1.0 + math.exp(-epsilon))


def unit_cap(population: int, sample_rate: float, tail: float) -> int:
    """The smallest c >= 1 with P[Binomial(population, q) > c] <= tail.

    scipy's ``binom.isf`` saturates at the population for tails below ~1e-16, so this
    bisects on ``binom.sf`` (accurate far into the tail: it is the regularised incomplete
    beta function).
    """
    if population <= 0:
        return 1
    low, high = 0, population  # sf(population) = 0 <= tail
    while low < high:
        mid = (low + high) // 2
        if float(binom.sf(mid, population, sample_rate)) <= tail:
            high = mid
        else:
            low = mid + 1
    return max(1, low)


def fixed_batch(*, sample_rate: float, expected_batch_size: int, steps: int,
                epsilon: float | None, delta: float | None, world_size: int = 1,
                rows_per_unit: int = 1) -> FixedBatch:
    """The fixed per-step work of a job, from public quantities only.

    Args:
        sample_rate: q.
        expected_batch_size: B (q = B / N̂).
        steps: T, the job's logical steps.
        epsilon: the job's ε (None: unknown).
        delta: the job's δ (None: unknown).
        world_size: W ranks, each sampling a shard of at most ⌈N̂ / W⌉ units.
        rows_per_unit: image rows per sampled unit (subjects: max_images_per_subject).
    """
    population = math.ceil(public_size(sample_rate=sample_rate,
                                       expected_batch_size=expected_batch_size) / world_size)
    eta = overflow_bound(epsilon=epsilon, delta=delta)
    units = unit_cap(population, sample_rate, eta / (max(steps, 1) * world_size))
    delta_timing = None if epsilon is None else eta * (1.0 + math.exp(epsilon))
    return FixedBatch(population=population, units=units, rows=units * rows_per_unit,
                      overflow_bound=eta, delta_timing=delta_timing)


@dataclass(frozen=True)
class PaddedRows:
    """A logical batch laid out on a fixed number of rows.

    Attributes:
        indices: [R'] record index of each row; -1 for a padding row (after the real ones).
        real: [R'] True for a real row.
    """

    indices: torch.Tensor
    real: torch.Tensor

    def __len__(self) -> int:
        return int(self.indices.numel())


def pad_indices(indices: torch.Tensor, fixed: FixedBatch) -> PaddedRows:
    """The batch's indices followed by padding rows up to ``fixed.rows_for(len)``."""
    size = int(indices.numel())
    total = fixed.rows_for(size)
    padded = torch.full((total,), -1, dtype=torch.long)
    padded[:size] = indices
    return PaddedRows(indices=padded, real=padded >= 0)


def pad_groups(groups: torch.Tensor, total: int) -> torch.Tensor:
    """Subject ordinals of ``total`` rows: the real rows' groups, then one new group per
    padding row (ascending, so no padding row ever joins or carries a real subject)."""
    size = int(groups.numel())
    first = int(groups.max()) + 1 if size else 0
    return torch.cat([groups.to(torch.long),
                      torch.arange(first, first + total - size, dtype=torch.long)])


def gather_rows(source: torch.Tensor, indices: torch.Tensor, *,
                fill: float | int = 0) -> torch.Tensor:
    """``source[indices]`` with ``fill`` rows where the index is -1 (padding), on
    ``source``'s device (a dataset resident on an accelerator is gathered there: no
    host-device copy of the rows).

    Works on an empty ``source`` (a class without records): every row is then padding.
    ``indices`` may live on the host; which rows are real is decided there (no device sync).
    """
    out = torch.full((int(indices.numel()), *source.shape[1:]), fill, dtype=source.dtype,
                     device=source.device)
    real = indices >= 0
    if bool(real.any()):
        on = source.device
        out[real.to(on)] = source[indices[real].to(on)]
    return out


def mask_losses(losses: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per-example losses with padding rows multiplied by 0: their gradient is exactly 0."""
    return losses * real.to(device=losses.device, dtype=losses.dtype)


__all__ = ["DEFAULT_OVERFLOW_BOUND", "TIMING_DELTA_FRACTION", "FixedBatch", "PaddedRows",
           "fixed_batch", "gather_rows", "mask_losses", "overflow_bound", "pad_groups",
           "pad_indices", "public_size", "unit_cap"]
