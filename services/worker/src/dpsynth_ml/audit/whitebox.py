"""White-box one-run audits with gradient (Dirac) canaries, through a real DP-SGD engine.

Each of m canaries is a coordinate of the trainable parameters (distinct, drawn at random)
and a gradient that is ``norm`` x C on that coordinate and 0 elsewhere. A coin flip puts
each canary in the run with probability 1/2. At every logical step the included canaries
are Poisson-sampled at the run's rate q (:class:`~dpsynth_ml.dp.PoissonSampler`, the
trainers' sampler), and each sampled canary's gradient goes through the engine's own
clipping into the step's sum: in the hooks engine opacus' clipping of dense per-unit rows
(``accumulate_gradients``); in the book-keeping engine the clip factor every unit gets,
applied to one-hot units (``accumulate_one_hot``: 10^5 canaries cost O(10^5)). Beside them
is whatever the caller's ``records_step`` added (the stand-in records' micro-batches). The
engine then noises the sum once and applies it, as in training. The auditor is white-box:
it reads the released gradient at every step, and a canary's score is the sum over the
steps of the released sum (gradient x the expected batch size) at its coordinate.
The scores and coin flips give the one-run bounds (:mod:`dpsynth_ml.audit.one_run`,
:mod:`dpsynth_ml.audit.gdp`).

What this measures is the mechanism as the engine runs it (clipping, the noise's scale and
count, the normalisation, the sampling rate it is given), not the code around it that picks
records, nor the accounting: the caller compares the bound with the epsilon the ledger
claims for the same (sigma, q, steps, delta).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dpsynth_ml.audit.gdp import GdpAuditBound, audit_gdp
from dpsynth_ml.audit.one_run import AuditBound, audit
from dpsynth_ml.dp.sampler import PoissonSampler

#: the canary gradient's norm in units of C: above 1, so that clipping is part of what is
#: audited (an engine that did not clip would release 10 C per canary)
DEFAULT_CANARY_NORM = 10.0
#: at most this many float32 values of canary rows at once (~256 MiB)
_ROW_BUDGET = 1 << 26


class AuditableEngine(Protocol):
    """What the audit needs of :class:`~dpsynth_ml.dp.DpSgdEngine` /
    :class:`~dpsynth_ml.dp.BookKeepingEngine`."""

    max_grad_norm: float

    @property
    def params(self) -> Sequence[torch.nn.Parameter]: ...

    def accumulate_gradients(self, rows: Sequence[torch.Tensor]) -> int: ...

    def privatize(self) -> None: ...

    def apply_update(self) -> None: ...


@dataclass(frozen=True)
class DiracCanaries:
    """m gradient canaries: where each one is and whether it is in the run.

    Attributes:
        coordinates: [m] distinct flat positions in the concatenated trainable parameters
            (in the engine's ``params`` order), int64.
        included: [m] the coin flips (bool), each True with probability 1/2.
        norm: each canary gradient's norm in units of C.
    """

    coordinates: torch.Tensor
    included: torch.Tensor
    norm: float = DEFAULT_CANARY_NORM

    @classmethod
    def draw(cls, num_coordinates: int, count: int, generator: torch.Generator, *,
             norm: float = DEFAULT_CANARY_NORM) -> DiracCanaries:
        """``count`` canaries on distinct random coordinates, with fair coin flips.

        Raises:
            ValueError: with more canaries than coordinates, none, or a norm <= 0.
        """
        if not 0 < count <= num_coordinates:
            raise ValueError(f"{count} canaries need 1..{num_coordinates} coordinates (one "
                             "trainable value each)")
        if not norm > 0:
            raise ValueError("the canary norm must be > 0")
        coordinates = torch.randperm(num_coordinates, generator=generator)[:count]
        included = torch.rand(count, generator=generator, dtype=torch.float64) < 0.5
        return cls(coordinates=coordinates, included=included, norm=norm)


@dataclass(frozen=True)
class WhiteBoxAudit:
    """A white-box audit's result: the bound, and what was run to get it.

    Attributes:
        bound: the one-run (eps, delta) lower bound and its counts.
        gdp: the f-DP one-run bound against a GDP claim (:mod:`dpsynth_ml.audit.gdp`),
            with the claim's verdict when a ``claimed_mu`` was given.
        steps, sample_rate: the run's logical steps and its canaries' sampling rate.
        presences: how many (canary, step) pairs had the canary in the step's batch.
        scores: [m] each canary's score (float64).
        engine: the audited engine's class (``BookKeepingEngine``, ``DpSgdEngine``).
        device, world_size: where the run was placed (rank 0's device) and on how many
            ranks (set by :func:`dpsynth_ml.audit.ranks.audit_on_ranks`).
    """

    bound: AuditBound
    gdp: GdpAuditBound
    steps: int
    sample_rate: float
    presences: int
    scores: np.ndarray
    engine: str = "unknown"
    device: str = "cpu"
    world_size: int = 1


def white_box_audit(engine: AuditableEngine, canaries: DiracCanaries, *, steps: int,
                    sample_rate: float, expected_batch_size: int,
                    generator: torch.Generator, delta: float, confidence: float = 0.95,
                    records_step: Callable[[], None] | None = None,
                    finish_step: Callable[[], None] | None = None,
                    claimed_mu: float | None = None,
                    tail_delta: float = 0.0, inject: bool = True) -> WhiteBoxAudit:
    """Run ``steps`` DP-SGD steps of ``engine`` with ``canaries`` and bound its epsilon.

    Args:
        engine: the DP-SGD engine under audit (its model is trained by the run and must not
            be released: it is the audit's, not a user's).
        canaries: from :meth:`DiracCanaries.draw` over ``engine``'s trainable values.
        steps: logical steps.
        sample_rate: q, each included canary's probability of joining a step.
        expected_batch_size: the engine's normaliser (the released gradient times this is
            the released sum).
        generator: the canaries' Poisson sampling (the noise is the engine's own).
        delta: the delta of the claims tested.
        confidence: of the bound.
        records_step: called at the start of every step to add the stand-in records'
            micro-batches to the engine (None: canaries only).
        finish_step: called after each released gradient was read, to apply it (and
            whatever a trainer does after, e.g. its LR schedule and EMA); None:
            ``engine.apply_update``.
        claimed_mu, tail_delta: the claim's GDP envelope (the ledger's
            ``dp_sgd_gdp_envelope`` of the accounted sigma, q and steps); with it the
            result says whether the run rejects its claim.
        inject: whether this process adds the canaries. On W ranks only rank 0 does (the
            canaries are units of rank 0's shard, each Poisson-sampled at q by rank 0's
            sampler); every rank still takes each step, whose ``privatize`` is the ranks'
            all-reduce and rank 0's single noise draw, and reads the released gradient.
            A rank that injects nothing returns scores that mean nothing (0 canaries seen).

    Raises:
        ValueError: on a canary outside the trainable values, or steps < 1.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    params = list(engine.params)
    total = sum(p.numel() for p in params)
    coordinates = canaries.coordinates.to(torch.long)
    if coordinates.numel() == 0 or int(coordinates.max()) >= total or int(
            coordinates.min()) < 0:
        raise ValueError("every canary must sit on one of the engine's trainable values")
    members = canaries.included.nonzero().flatten()
    sampler = PoissonSampler(int(members.numel()), sample_rate, generator)
    value = canaries.norm * engine.max_grad_norm
    chunk = max(1, min(1024, _ROW_BUDGET // max(total, 1)))
    scores = torch.zeros(coordinates.numel(), dtype=torch.float64)
    presences = 0
    for _ in range(steps):
        if records_step is not None:
            records_step()
        if inject:
            sampled = members[sampler.sample()]
            presences += int(sampled.numel())
            _add_canaries(engine, coordinates[sampled], value, params, chunk)
        engine.privatize()
        released = torch.cat([_grad(p).detach().flatten() for p in params])
        scores += (released[coordinates.to(released.device)].to(torch.float64).cpu()
                   * expected_batch_size)
        (finish_step or engine.apply_update)()
    values, flips = scores.numpy(), canaries.included.numpy()
    return WhiteBoxAudit(
        bound=audit(values, flips, confidence=confidence, delta=delta),
        gdp=audit_gdp(values, flips, confidence=confidence, delta=delta,
                      claimed_mu=claimed_mu, tail_delta=tail_delta),
        steps=steps, sample_rate=sample_rate, presences=presences, scores=values,
        engine=type(engine).__name__)


def _add_canaries(engine: AuditableEngine, positions: torch.Tensor, value: float,
                  params: list[torch.nn.Parameter], chunk: int) -> None:
    """Clip and add one step's sampled canaries (each ``value`` at one position): as
    one-hot units where the engine takes them (the book-keeping engine, O(n)), else as
    dense per-unit rows, ``chunk`` at a time (opacus' clipping in the hooks engine)."""
    one_hot = getattr(engine, "accumulate_one_hot", None)
    if one_hot is not None:
        one_hot(positions, torch.full((int(positions.numel()),), value, dtype=torch.float64))
        return
    sizes = [p.numel() for p in params]
    device = params[0].device
    for start in range(0, int(positions.numel()), chunk):
        part = positions[start:start + chunk].to(device)
        flat = torch.zeros((int(part.numel()), sum(sizes)), dtype=params[0].dtype,
                           device=device)
        flat[torch.arange(int(part.numel()), device=device), part] = value
        engine.accumulate_gradients([r.reshape(-1, *p.shape) for r, p in
                                     zip(torch.split(flat, sizes, dim=1), params,
                                         strict=True)])


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise RuntimeError("the engine released no gradient for a trainable parameter")
    return p.grad
