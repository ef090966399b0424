"""Use cases: read grants, step leases (charged when granted), job epsilon.

Fencing: a read grant for attempt a sets ``current_attempt = max(current, a)``; only the
current attempt gets leases, so a newer attempt's grant fences every older one, and every
grant token expires with its lease (the object store checks the expiry too).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, ParallelEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.grants import GrantClaims, sign_grant
from dpsynth_shared.ids import new_id, new_lease_id
from dpsynth_shared.ledger_contract import (
    JobEpsilon,
    JobEpsilonRequest,
    Lease,
    LeaseRequest,
    ReadGrant,
    ReadGrantRequest,
    ReservationState,
)
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import ACCOUNTANT_NAME, dp_sgd_epsilon, mul_up, pld_epsilon
from dpsynth_ledger.book import (
    Run,
    charge,
    disjoint_of,
    refresh_reserved,
    run_of,
    runs,
    sync_totals,
)
from dpsynth_ledger.chain import CENTRAL_IMAGES_RELEASED, RESTORED_CHARGE, central_event
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget, LeaseRow, ReservationRow
from dpsynth_ledger.service.reservations import check_live, locked, write_entry
from dpsynth_ledger.views import event_of, job_event


def _grant(res: ReservationRow, attempt: int, expires_at: datetime,
           ctx: LedgerContext) -> ReadGrant:
    claims = GrantClaims(grant_id=new_id("grant"), dataset_id=res.dataset_id,
                         reservation_id=res.reservation_id, job_id=res.job_id, attempt=attempt,
                         expires_at=expires_at.timestamp())
    return ReadGrant(token=sign_grant(claims, ctx.signing_key), dataset_id=res.dataset_id,
                     reservation_id=res.reservation_id, attempt=attempt, expires_at=expires_at)


def read_grant(session: Session, *, reservation_id: str, request: ReadGrantRequest,
               ctx: LedgerContext) -> ReadGrant:
    """Issue a read grant: the reservation becomes touched; the attempt becomes current.

    Raises:
        DpsynthError: ``stale_attempt`` for an attempt below the current one; ``conflict``
            for a closed reservation.
    """
    budget, res = locked(session, reservation_id)
    if res.state == ReservationState.CLOSED:
        raise DpsynthError(ErrorCode.CONFLICT, "the reservation is closed")
    if request.attempt < res.current_attempt:
        raise DpsynthError(ErrorCode.STALE_ATTEMPT,
                           f"attempt {request.attempt} is older than the current attempt "
                           f"{res.current_attempt}", current_attempt=res.current_attempt)
    res.current_attempt = request.attempt
    res.state = ReservationState.TOUCHED
    expires_at = datetime.now(UTC) + timedelta(seconds=ctx.lease_ttl_s)
    grant = _grant(res, request.attempt, expires_at, ctx)
    session.flush()
    write_entry(session, budget, res, "read_grant", attempt=request.attempt,
                worker_id=request.worker_id, expires_at=expires_at.isoformat())
    session.commit()
    ctx.metrics.read_grants.inc()
    return grant


def grant_lease(session: Session, *, reservation_id: str, request: LeaseRequest,
                ctx: LedgerContext) -> Lease:
    """Grant steps [start, start + steps) to the current attempt and CHARGE them now.

    Raises:
        DpsynthError: ``stale_attempt``; ``read_grant_required`` on an untouched reservation;
            ``reservation_exhausted`` (with the numbers) beyond the reserved steps.
    """
    budget, res = locked(session, reservation_id)
    if res.state == ReservationState.OPEN:
        raise DpsynthError(ErrorCode.GRANT_REQUIRED, "take a read grant before a step lease")
    check_live(res, request.attempt)
    run = run_of(res, request.partition)
    if run.steps_granted + request.steps > run.steps_reserved:
        where = {"partition": run.partition} if res.per_label else {}
        raise DpsynthError(
            ErrorCode.RESERVATION_EXHAUSTED,
            "the lease would exceed the reservation; extend it through the filter first",
            steps_reserved=run.steps_reserved, steps_granted=run.steps_granted,
            steps_requested=request.steps,
            steps_remaining=run.steps_reserved - run.steps_granted, **where)
    accs = repo.accumulators(session, budget.dataset_id)
    amount = mul_up(request.steps, run.rdp_per_step)
    # a class's run charges its class only, or every partition when the labels are not
    # disjoint in the privacy unit (sequential per-label composition: book.touched)
    delta = charge(accs, run.partition, amount, disjoint_of(budget))
    run.steps_granted += request.steps
    run.rdp_outstanding = mul_up(run.steps_reserved - run.steps_granted, run.rdp_per_step)
    sync_totals(res)
    refresh_reserved(accs, repo.reservations_of(session, budget.dataset_id),
                     disjoint_of(budget))
    now = datetime.now(UTC)
    label = run.partition if res.per_label else None
    lease = LeaseRow(lease_id=new_lease_id(), reservation_id=res.reservation_id,
                     attempt=request.attempt, start_step=request.start_step,
                     steps=request.steps, partition=label, granted_at=now,
                     expires_at=now + timedelta(seconds=ctx.lease_ttl_s))
    repo.add(session, lease)
    write_entry(session, budget, res, "lease_granted", attempt=request.attempt,
                lease_id=lease.lease_id, start_step=request.start_step, steps=request.steps,
                event=event_of(run, request.steps).model_dump(mode="json"), rdp_delta=delta,
                **({"label": label} if label is not None else {}))
    session.commit()
    ctx.metrics.leases.inc()
    return _lease_view(res, lease, budget, lease.expires_at, ctx)


def _lease_view(res: ReservationRow, lease: LeaseRow, budget: Budget, grant_expiry: datetime,
                ctx: LedgerContext) -> Lease:
    run = run_of(res, lease.partition)
    granted = max(dp_sgd_epsilon(r.noise_multiplier, r.sample_rate, r.steps_granted,
                                 budget.delta, ctx.discretization, budget.neighbouring)
                  for r in runs(res))
    return Lease(
        lease_id=lease.lease_id, reservation_id=res.reservation_id, attempt=lease.attempt,
        start_step=lease.start_step, steps=lease.steps, expires_at=lease.expires_at,
        grant=_grant(res, lease.attempt, grant_expiry, ctx), partition=lease.partition,
        steps_granted_total=run.steps_granted, job_epsilon_granted=granted)


def end_lease(session: Session, *, reservation_id: str, lease_id: str,
              ctx: LedgerContext) -> Lease:
    """End a lease early (its grant expires now). Never refunds: the steps stay charged."""
    budget, res = locked(session, reservation_id)
    lease = repo.get_lease(session, lease_id)
    if lease is None or lease.reservation_id != reservation_id:
        raise NotFound("lease", lease_id)
    if lease.ended_at is None:
        lease.ended_at = datetime.now(UTC)
        write_entry(session, budget, res, "lease_ended", attempt=lease.attempt,
                    lease_id=lease.lease_id, steps=lease.steps)
    session.commit()
    return _lease_view(res, lease, budget, lease.ended_at, ctx)


def job_epsilon(session: Session, *, request: JobEpsilonRequest,
                ctx: LedgerContext) -> JobEpsilon:
    """PLD ε of the composition of the steps that produced a model.

    Those are the granted steps of each reservation, or fewer where ``steps_used`` says so
    (steps replayed after a crash are charged to the dataset but are not on the model's
    path), composed with the central-image releases ``release_ids`` names (a Gaussian, or
    subsampled queries as DP-SGD: whole-dataset training mechanisms). Claiming more steps
    than were granted is refused, and so is a release id that names no charged
    central-image release of the dataset (400 ``invalid_request``).
    """
    budget = repo.get_budget(session, request.dataset_id)
    if budget is None:
        raise NotFound("budget", request.dataset_id)
    rows = repo.reservations_of(session, request.dataset_id, request.reservation_ids)
    missing = set(request.reservation_ids) - {r.reservation_id for r in rows}
    if missing:
        raise NotFound("reservation", sorted(missing)[0])
    used = request.steps_used or {}
    counted: list[int] = []

    def steps_of(run: Run) -> int:
        claim = used.get(run.reservation_id)
        if isinstance(claim, dict):
            steps = claim.get(run.partition, run.steps_granted)
        else:
            steps = run.steps_granted if claim is None else claim
        if not 0 <= steps <= run.steps_granted:
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               f"steps_used {steps} for {run.reservation_id} is outside "
                               f"[0, {run.steps_granted}] (its granted steps)")
        counted.append(steps)
        return steps

    events: list[Mechanism] = [job_event(r, steps_of) for r in rows if r.steps_granted]
    releases = _releases(session, budget.dataset_id, request.release_ids,
                         request.reservation_ids)
    events += releases
    labels = sorted({p.partition for r in rows if r.per_label for p in r.parts})
    relation, disjoint = budget.neighbouring, disjoint_of(budget)
    if len(rows) + len(releases) > ctx.heavy.max_composition:
        composed = len(rows) + len(releases)
        raise DpsynthError(ErrorCode.PLAN_TOO_LARGE,
                           f"the model composes {composed} reservations and releases; the "
                           f"ledger composes at most {ctx.heavy.max_composition} "
                           "(max_tight_composition)",
                           bound="max_tight_composition", limit=ctx.heavy.max_composition,
                           value=composed)
    with ctx.heavy.slot("a model's epsilon"):  # a PLD composition per class, and overall
        per_label = {c: pld_epsilon(_restricted(events, c), budget.delta, ctx.discretization,
                                    dataset=relation) for c in labels} or None
        epsilon = pld_epsilon(events, budget.delta, ctx.discretization, dataset=relation,
                              disjoint=disjoint)
    return JobEpsilon(
        dataset_id=budget.dataset_id, reservation_ids=request.reservation_ids,
        job_epsilon=epsilon,
        delta=budget.delta, steps_granted=sum(r.steps_granted for r in rows),
        steps_used=sum(counted), accountant=ACCOUNTANT_NAME, per_label=per_label)


Mechanism = DpSgdEvent | GaussianEvent | ParallelEvent


def _releases(session: Session, dataset_id: str, release_ids: list[str],
              reservation_ids: list[str]) -> list[DpSgdEvent | GaussianEvent]:
    """The events of the central-image releases on a model's path (each once): those named
    by ``release_ids`` and EVERY release charged under one of ``reservation_ids`` (the
    model's own reservation and its DP ancestors'; a release repeated after a crash before
    the first checkpoint is counted too, an over-statement, never an under-statement).

    Raises:
        DpsynthError: ``invalid_request`` for an id that names no charged central-image
            release of this dataset.
    """
    entries = [e for e in repo.entries(session, dataset_id=dataset_id)
               if e.kind == CENTRAL_IMAGES_RELEASED or (  # or its copy restored from the anchor
                   e.kind == RESTORED_CHARGE and e.payload.get("event") is not None
                   and e.payload.get("restored_kind") == CENTRAL_IMAGES_RELEASED)]
    known = {str(e.payload.get("release_id")): e.payload["event"] for e in entries}
    under = set(reservation_ids)
    of_reservations = [str(e.payload.get("release_id")) for e in entries
                       if e.payload.get("reservation_id") in under]
    # a release on the model's path counts once
    wanted = list(dict.fromkeys([*of_reservations, *release_ids]))
    unknown = [r for r in wanted if r not in known]
    if unknown:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "release_ids names no charged "
                           "central-image release of this dataset", release_id=unknown[0],
                           dataset_id=dataset_id)
    return [central_event(known[r]) for r in wanted]


def _restricted(events: list[Mechanism], label: str) -> list[Mechanism]:
    """What a record of class ``label`` went through: whole-dataset runs and releases, and
    its class's."""
    out: list[Mechanism] = []
    for ev in events:
        if not isinstance(ev, ParallelEvent):
            out.append(ev)
        elif label in ev.partitions:
            out.append(ParallelEvent(partitions={label: ev.partitions[label]}))
    return out


def get_reservation(session: Session, *, reservation_id: str, ctx: LedgerContext):  # type: ignore[no-untyped-def]
    """A reservation's view."""
    from dpsynth_ledger.views import reservation_view

    res = repo.get_reservation(session, reservation_id)
    if res is None:
        raise NotFound("reservation", reservation_id)
    budget = repo.get_budget(session, res.dataset_id)
    assert budget is not None
    return reservation_view(res, budget, ctx.discretization)
