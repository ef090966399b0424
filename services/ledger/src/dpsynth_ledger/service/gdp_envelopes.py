"""Use case: the Gaussian-DP envelope of a DP-SGD run, the claim a one-run audit tests.

Stateless: no row is read or written and nothing is charged. The envelope
(:func:`~dpsynth_ledger.accounting.gdp_envelope.dp_sgd_gdp_envelope`) is a fine PLD of the
run composed over its steps and a search on a grid of ε: seconds of CPU for a small run,
more for a long or weakly noised one. It therefore follows :mod:`dpsynth_ledger.heavy`'s
rules: bounded before done (the ledger's ``max_steps``, and a floor on σ below which the
PLD's support, ~1/σ² wide at interval 1e-4, grows without bound), then computed in one of the
heavy slots (503 ``ledger_busy`` when none frees in time). The result is cached in the
process (the function's own LRU cache), so an audit's repeated question is answered at once.
"""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import GdpEnvelope, GdpEnvelopeRequest

from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ledger.context import LedgerContext

ACCOUNTANT = "pld (dp_accounting), add/remove, Poisson; envelope on a grid of epsilon"
"""How the envelope is computed (the answer's ``accountant``)."""

MIN_NOISE_MULTIPLIER = 0.1
"""The smallest σ the ledger computes an envelope for (at 0.1 one full-batch step already
takes ~25 s of CPU; a smaller σ's PLD grows as 1/σ², a memory hazard, and its μ (> 10) is
a claim no one-run audit can reject)."""


def _check_bounds(request: GdpEnvelopeRequest, ctx: LedgerContext) -> None:
    """Refuse a run whose envelope would cost too much, before computing anything.

    Raises:
        DpsynthError: 422 ``plan_too_large`` (``max_steps`` or ``min_noise_multiplier``).
    """
    ctx.heavy.check_steps(request.steps)
    if request.noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise DpsynthError(ErrorCode.PLAN_TOO_LARGE,
                           f"noise_multiplier {request.noise_multiplier:g} is below the "
                           f"ledger's floor {MIN_NOISE_MULTIPLIER:g} for a GDP envelope",
                           bound="min_noise_multiplier", limit=MIN_NOISE_MULTIPLIER,
                           value=request.noise_multiplier)


def gdp_envelope(*, request: GdpEnvelopeRequest, ctx: LedgerContext) -> GdpEnvelope:
    """The smallest μ whose μ-GDP profile covers the run's PLD profile, and the tail δ.

    Raises:
        DpsynthError: 422 ``plan_too_large`` beyond the bounds, 422 ``invalid_spec`` when
            the computation refuses the run (no envelope below μ 1e4, bad inputs), 503
            ``ledger_busy`` when no heavy slot frees in time.
    """
    _check_bounds(request, ctx)
    try:
        with ctx.heavy.slot("a GDP envelope"):
            envelope = dp_sgd_gdp_envelope(request.noise_multiplier, request.sample_rate,
                                           request.steps)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"no GDP envelope for this run: {exc}") from exc
    return GdpEnvelope(noise_multiplier=request.noise_multiplier,
                       sample_rate=request.sample_rate, steps=request.steps, mu=envelope.mu,
                       tail_delta=envelope.tail_delta, accountant=ACCOUNTANT)
