"""Use case: a finetune's DP central-image release (DP-FETA warm-up), charged to the budget of
the job's reservation before the worker draws the noise.

The terms are :mod:`dpsynth_shared.central_images` (docs/privacy.md, "Central images"):

* **Bound and sensitivity.** Each unit's centred, ``downsample``-averaged contribution has L2
  norm at most the public bound B = 0.5·√(h·w·c) of the downsampled image (a subject's whole
  contribution, all its classes together, is clipped once to B). The release is the vector
  of ALL class sums plus N(0, σ²) per coordinate: ONE Gaussian mechanism of L2 sensitivity
  Δ = B under add/remove and 2·B under replace-one; both × √2 when the release also carries
  the class second moments (``second_moments``: outer products scaled by 1/B, each unit's
  bounded by B; at most ``MAX_SECOND_MOMENT_DIM`` downsampled coordinates, else 422).
* **One full-data query** (``sample_rate`` None): a :class:`GaussianEvent` recorded under the
  dataset's relation, σ = z·Δ with the multiplier z calibrated for (target, δ) at the
  dataset's δ exactly as the class-size histogram's (the analytic Gaussian mechanism, raised
  until its PLD figure meets the target). Its RDP at α* is α*·Δ²/(2σ²) = α*/(2z²), exact under
  the dataset's relation (no group privacy: Δ already is the replace-one sensitivity).
* **Subsampled queries** (``sample_rate`` q): ``queries`` Poisson-subsampled sums at rate q,
  each with the same bound and noise std z·B: exactly a :class:`DpSgdEvent` (z, q, queries),
  analysed add/remove like DP-SGD (noise std z·√2·B when the release carries the second
  moments, whose unit norm is √2·B). z is calibrated like a DP-SGD reservation
  (``ctx.heavy.noise_multiplier``: on a replace-one dataset for the standalone replace-one
  PLD figure) and the filter is charged like a DP-SGD lease (on a replace-one dataset through
  group privacy at distance 2: 3·RDP_add/remove(2α*), :func:`~dpsynth_ledger.accounting.
  charge_step`).
* **Partitions.** The release reads the TRAINING part only (every class at once), so every
  training partition (``"*"`` and every label) is charged the full RDP once, whatever the
  labels' disjointness in the unit; the held-out partition is untouched.
* **Admission** goes through the RDP filter under the budget-row lock, on top of what the
  job's own reservation holds, all or nothing, committed at once: ``central_images_released``
  (with the event, the bound, the noise std and ``rdp_delta``) or ``central_images_refused``
  (409 with the numbers). Each accepted call is a new charge (a retried attempt pays again:
  never under-counted). ``GET /v1/chain/verify`` recomputes both event types.
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.dp_events import GaussianEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound, budget_refusal
from dpsynth_shared.ids import new_id
from dpsynth_shared.ledger_contract import ReservationState
from dpsynth_shared.release_contract import CentralImagesRelease, CentralImagesRequest
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    WHOLE_DATASET,
    add_up,
    max_admissible_target,
)
from dpsynth_ledger.book import charge, figures, flt, snapshot, touched
from dpsynth_ledger.chain import CENTRAL_IMAGES_REFUSED, CENTRAL_IMAGES_RELEASED, append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.metrics import counts_refusals
from dpsynth_ledger.models import Accumulator, Budget, ReservationRow
from dpsynth_ledger.service.central_terms import CentralEvent, charge_of, event_of
from dpsynth_ledger.service.histograms import max_admissible_histogram_target
from dpsynth_ledger.service.plans import refusal_numbers

RELEASED = CENTRAL_IMAGES_RELEASED
REFUSED = CENTRAL_IMAGES_REFUSED
KINDS = (RELEASED, REFUSED)

def _authorised(session: Session, reservation_id: str,
                request: CentralImagesRequest) -> ReservationRow:
    res = repo.get_reservation(session, reservation_id)
    if res is None:
        raise NotFound("reservation", reservation_id)
    if res.job_id != request.job_id:
        raise DpsynthError(ErrorCode.CONFLICT, "the reservation belongs to another job",
                           reservation_id=reservation_id)
    if res.state == ReservationState.CLOSED:
        raise DpsynthError(ErrorCode.CONFLICT, "the reservation is closed",
                           reservation_id=reservation_id)
    return res


def _plan(budget: Budget, res: ReservationRow, accs: dict[str, Accumulator], *,
          event: CentralEvent, bound: float, noise_std: float, epsilon: float,
          target: float, second_moments: bool) -> CentralImagesRelease:
    """The release against the accounts BEFORE its charge (a dry run shows exactly this)."""
    f = flt(budget)
    rdp = charge_of(event, budget)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    train = touched(WHOLE_DATASET, accs)  # the held-out partition does not see the images
    return CentralImagesRelease(
        reservation_id=res.reservation_id, dataset_id=budget.dataset_id, job_id=res.job_id,
        event=event, bound=bound, second_moments=second_moments, noise_std=noise_std,
        target_epsilon=target,
        epsilon=epsilon, delta=budget.delta, admission_order=budget.admission_order,
        rdp_charge=rdp, partitions=train,
        dataset_epsilon_spent_before=figures(budget, accs)["dataset_epsilon_spent"],
        dataset_epsilon_spent_after=f.epsilon(max(add_up(c, rdp if p in train else 0.0)
                                                  for p, c in committed.items())),
        admissible=f.admits(committed=committed, reserved=reserved, new={p: rdp for p in train}),
        charged=False, accountant=ACCOUNTANT_NAME)


def _best(budget: Budget, event: CentralEvent, room: float, ctx: LedgerContext) -> float | None:
    """The largest target of the same shape that fits ``room`` (None: nothing fits)."""
    if isinstance(event, GaussianEvent):  # RDP α*/(2z²) under either relation
        return max_admissible_histogram_target(budget, room, ctx)
    if room <= 0:
        return None
    return max_admissible_target(room, event.sample_rate, event.steps, budget.admission_order,
                                 budget.delta, ctx.discretization, budget.neighbouring)


@counts_refusals("central_images")
def release(session: Session, *, reservation_id: str, request: CentralImagesRequest,
            ctx: LedgerContext) -> CentralImagesRelease:
    """Admit and charge one central-image release (or, with ``dry_run``, only show it).

    The noise is calibrated outside the lock; then one transaction takes the budget row,
    re-checks the reservation, checks committed + reserved + charge ≤ budget on EVERY
    training partition, and either charges every one of them and records
    ``central_images_released``, or records ``central_images_refused``.

    Raises:
        NotFound: an unknown reservation or budget.
        DpsynthError: ``conflict`` when the reservation belongs to another job or is
            closed; ``invalid_request`` for a bad image shape or an unreachable target.
        BudgetExhausted: 409 with the numbers (nothing charged; the refusal is recorded).
    """
    res = _authorised(session, reservation_id, request)
    dataset_id = res.dataset_id
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    event, bound, noise_std, epsilon = event_of(budget, request, ctx)
    target = request.target_epsilon
    if request.dry_run:
        plan = _plan(budget, res, repo.accumulators(session, dataset_id), event=event,
                     bound=bound, noise_std=noise_std, epsilon=epsilon, target=target,
                     second_moments=request.second_moments)
        session.commit()
        return plan
    session.commit()  # end the read transaction: the decision is taken under the lock only
    session.expire_all()
    budget = repo.lock_budget(session, dataset_id)
    assert budget is not None
    try:
        res = _authorised(session, reservation_id, request)  # not closed meanwhile
    except DpsynthError:
        session.rollback()
        raise
    accs = repo.accumulators(session, dataset_id)
    out = _plan(budget, res, accs, event=event, bound=bound, noise_std=noise_std,
                epsilon=epsilon, target=target, second_moments=request.second_moments)
    rdp = out.rdp_charge
    new = {p: rdp for p in out.partitions}
    release_id = new_id("release")
    details: dict[str, Any] = {
        "release_id": release_id, "reservation_id": res.reservation_id, "job_id": res.job_id,
        "attempt": request.attempt, "event": event.model_dump(mode="json"), "bound": bound,
        "noise_std": noise_std, "image_size": request.image_size,
        "channels": request.channels, "downsample": request.downsample,
        "sample_rate": request.sample_rate, "queries": request.queries,
        "second_moments": request.second_moments, "target_epsilon": target,
        "epsilon": epsilon,
        "admission_order": budget.admission_order, "rdp_requested": rdp}
    if not out.admissible:
        numbers = refusal_numbers(budget, accs, target=target, job_epsilon=epsilon,
                                  new=new)
        append_entry(session, dataset_id=dataset_id, kind=REFUSED, payload={
            **details, "decision": "refused", "numbers": numbers,
            "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
        session.commit()
        f = flt(budget)
        committed = {p: a.committed for p, a in accs.items()}
        reserved = {p: a.reserved for p, a in accs.items()}
        room = f.room(committed=committed, reserved=reserved, partitions=list(new))
        raise budget_refusal({k: v for k, v in numbers.items() if k != "accumulators"},
                             best=_best(budget, event, room, ctx),
                             held=f.room(committed=committed, reserved={},
                                         partitions=list(new)) > 0,
                             what="central-image release",
                             field="training.central_images.target_epsilon")
    rdp_delta = charge(accs, WHOLE_DATASET, rdp)  # "*" and every label, once each
    append_entry(session, dataset_id=dataset_id, kind=RELEASED, payload={
        **details, "decision": "accepted", "rdp_delta": rdp_delta,
        "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
    session.commit()
    ctx.metrics.accepted("central_images")
    return out.model_copy(update={"release_id": release_id, "charged": True})

