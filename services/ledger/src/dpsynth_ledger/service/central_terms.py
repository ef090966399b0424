"""The calibration of a central-image release from its public terms (shared by the release
itself, :mod:`dpsynth_ledger.service.central_images`, and the plan of the job that makes it,
:mod:`dpsynth_ledger.service.plans`): the bound, the event, the noise std and the RDP it
charges. The terms and their sensitivities are documented in ``central_images``.
"""

from __future__ import annotations

from dpsynth_shared.central_images import (
    MAX_SECOND_MOMENT_DIM,
    central_image_bound,
    central_image_sensitivity,
    central_image_unit_norm,
    second_moment_dim,
)
from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.release_contract import CentralImagesCharge, CentralImagesTerms

from dpsynth_ledger.accounting import (
    dp_sgd_epsilon,
    gaussian_discretization,
    gaussian_epsilon,
    rdp_at_order,
)
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget

CentralEvent = DpSgdEvent | GaussianEvent


def bound_of(request: CentralImagesTerms) -> float:
    """The public L2 bound of one unit's contribution (422 when ``downsample`` does not
    divide ``image_size``)."""
    try:
        bound = central_image_bound(request.image_size, request.channels, request.downsample)
        dim = second_moment_dim(request.image_size, request.channels, request.downsample)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    if request.second_moments and dim > MAX_SECOND_MOMENT_DIM:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, f"second moments of {dim} downsampled "
                           f"coordinates: at most {MAX_SECOND_MOMENT_DIM} (downsample more)",
                           dimension=dim)
    return bound


def event_of(budget: Budget, request: CentralImagesTerms,
             ctx: LedgerContext) -> tuple[CentralEvent, float, float, float]:
    """The calibrated release: (event, bound, noise std per coordinate, standalone ε).

    Raises:
        DpsynthError: ``invalid_request`` for a bad shape, queries without a sample rate, a
            sample rate below 1/declared_size or an unreachable target; ``plan_too_large``
            beyond the ledger's step bound.
    """
    bound = bound_of(request)
    relation = budget.neighbouring
    target = request.target_epsilon
    if request.sample_rate is None:
        if request.queries != 1:
            raise DpsynthError(ErrorCode.INVALID_REQUEST, "several queries need a sample_rate "
                               "(a repeated full-data query only averages its noise)")
        s = central_image_sensitivity(bound, relation, second_moments=request.second_moments)
        try:
            multiplier = ctx.heavy.gaussian_sigma(target, budget.delta)
        except ValueError as exc:
            raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
        event: CentralEvent = GaussianEvent(sigma=multiplier * s, sensitivity=s,
                                            neighbouring=Neighbouring(relation))
        epsilon = gaussian_epsilon(multiplier, budget.delta,
                                   gaussian_discretization(target, ctx.discretization))
        return event, bound, multiplier * s, epsilon
    q, queries = request.sample_rate, request.queries
    if q * budget.declared_size < 1.0:
        # as for a DP-SGD job (q = batch / N̂ with a batch of at least one unit): a query that
        # expects less than one unit releases noise, and its calibration would run for minutes
        raise DpsynthError(ErrorCode.INVALID_REQUEST, f"sample_rate {q:g} expects less than "
                           f"one unit per query of the dataset's {budget.declared_size} "
                           "(declared size): at least 1/declared_size",
                           sample_rate=q, declared_size=budget.declared_size)
    try:
        z = ctx.heavy.noise_multiplier(target, q, queries, budget.delta, relation)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    event = DpSgdEvent(noise_multiplier=z, sample_rate=q, steps=queries)
    epsilon = dp_sgd_epsilon(z, q, queries, budget.delta, ctx.discretization, relation)
    return event, bound, z * central_image_unit_norm(bound, request.second_moments), epsilon


def charge_of(event: CentralEvent, budget: Budget) -> float:
    """The RDP the release adds to each training partition at the filter's order (a DP-SGD
    event on a replace-one dataset: through group privacy, as a lease is charged)."""
    return rdp_at_order(event, budget.admission_order, budget.neighbouring)


def planned_charge(budget: Budget, terms: CentralImagesTerms, partitions: list[str],
                   ctx: LedgerContext) -> CentralImagesCharge:
    """The release as a job's plan composes it: calibrated exactly as the worker's release
    will be (:func:`event_of`), charged ``charge_of`` to each of ``partitions``."""
    event, bound, noise_std, epsilon = event_of(budget, terms, ctx)
    return CentralImagesCharge(event=event, bound=bound, noise_std=noise_std, epsilon=epsilon,
                               rdp_charge=charge_of(event, budget), partitions=partitions)
