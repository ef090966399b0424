"""HTTP transport of the ledger: each route calls one use case."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from dpsynth_shared.errors import DpsynthError, ErrorCode, problem_schema_fields
from dpsynth_shared.ledger_contract import (
    AnchorStatus,
    BudgetView,
    ChainKey,
    CloseRequest,
    CreateBudget,
    ExtendRequest,
    GdpEnvelope,
    GdpEnvelopeRequest,
    JobEpsilon,
    JobEpsilonRequest,
    Lease,
    LeaseRequest,
    LedgerEntry,
    LimitUpdate,
    Plan,
    PlanRequest,
    ReadGrant,
    ReadGrantRequest,
    RecomputeReport,
    ReconcileReport,
    ReconcileRequest,
    Reservation,
    ReserveRequest,
    VerifyReport,
)
from dpsynth_shared.release_contract import (
    CentralImagesRelease,
    CentralImagesRequest,
    DpEvaluationRelease,
    DpEvaluationRequest,
    Evaluation,
    EvaluationGrantRequest,
    EvaluationRequest,
    HistogramRelease,
    HistogramRequest,
    SetClassSizes,
    SizeReleasePlan,
    SizeReleasePlanRequest,
)
from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.chain import anchor_status, verify_chain
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.service import (
    budgets,
    central_images,
    dp_evaluations,
    evaluations,
    gdp_envelopes,
    histograms,
    leases,
    plans,
    policies,
    reservations,
    sizes,
)
from dpsynth_ledger.service import reconcile as reconciliation


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def _ctx(request: Request) -> LedgerContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


SessionDep = Annotated[Session, Depends(_session)]
CtxDep = Annotated[LedgerContext, Depends(_ctx)]
ERRORS = {400: problem_schema_fields(), 401: problem_schema_fields(),
          404: problem_schema_fields(), 409: problem_schema_fields()}

router = APIRouter(prefix="/v1", responses=ERRORS)  # type: ignore[arg-type]


@router.post("/budgets", response_model=BudgetView, status_code=201)
def create_budget(body: CreateBudget, session: SessionDep, ctx: CtxDep) -> BudgetView:
    return budgets.create_budget(session, request=body, ctx=ctx)


@router.post("/size-release-plans", response_model=SizeReleasePlan)
def plan_size_release(body: SizeReleasePlanRequest, ctx: CtxDep) -> SizeReleasePlan:
    """σ of a DP count of a dataset's size, before its budget exists (charges nothing)."""
    return sizes.plan_size_release(request=body, ctx=ctx)


@router.get("/budgets/{dataset_id}", response_model=BudgetView)
def get_budget(dataset_id: str, session: SessionDep, ctx: CtxDep,
               history: bool = True) -> BudgetView:
    return budgets.get_budget(session, dataset_id=dataset_id, ctx=ctx, with_history=history)


@router.post("/budgets/{dataset_id}/histogram-releases", response_model=HistogramRelease,
             status_code=201)
def release_histogram(dataset_id: str, body: HistogramRequest, session: SessionDep,
                      ctx: CtxDep) -> HistogramRelease:
    """Release the class-size histogram, charged at once (``dry_run``: only the plan)."""
    return histograms.release_histogram(session, dataset_id=dataset_id, request=body, ctx=ctx)


@router.put("/budgets/{dataset_id}/class-sizes", response_model=BudgetView)
def set_class_sizes(dataset_id: str, body: SetClassSizes, session: SessionDep,
                    ctx: CtxDep) -> BudgetView:
    """Set the public class sizes released by a charged histogram (once)."""
    return histograms.set_class_sizes(session, dataset_id=dataset_id, request=body, ctx=ctx)


@router.post("/plans", response_model=Plan)
def plan(body: PlanRequest, session: SessionDep, ctx: CtxDep) -> Plan:
    return plans.make_plan(session, request=body, ctx=ctx)


@router.post("/reservations", response_model=Reservation | Plan, status_code=201)
def reserve(body: ReserveRequest, session: SessionDep, ctx: CtxDep) -> Reservation | Plan:
    """Admit a job (or, with ``dry_run``, return only its :class:`Plan`)."""
    return reservations.reserve(session, request=body, ctx=ctx)


@router.get("/reservations/{reservation_id}", response_model=Reservation)
def get_reservation(reservation_id: str, session: SessionDep, ctx: CtxDep) -> Reservation:
    return leases.get_reservation(session, reservation_id=reservation_id, ctx=ctx)  # type: ignore[no-any-return]


@router.post("/reservations/{reservation_id}/read-grants", response_model=ReadGrant,
             status_code=201)
def read_grant(reservation_id: str, body: ReadGrantRequest, session: SessionDep,
               ctx: CtxDep) -> ReadGrant:
    return leases.read_grant(session, reservation_id=reservation_id, request=body, ctx=ctx)


@router.post("/reservations/{reservation_id}/leases", response_model=Lease, status_code=201)
def grant_lease(reservation_id: str, body: LeaseRequest, session: SessionDep,
                ctx: CtxDep) -> Lease:
    return leases.grant_lease(session, reservation_id=reservation_id, request=body, ctx=ctx)


@router.post("/reservations/{reservation_id}/leases/{lease_id}/end", response_model=Lease)
def end_lease(reservation_id: str, lease_id: str, session: SessionDep, ctx: CtxDep) -> Lease:
    return leases.end_lease(session, reservation_id=reservation_id, lease_id=lease_id, ctx=ctx)


@router.post("/reservations/{reservation_id}/extend", response_model=Reservation)
def extend(reservation_id: str, body: ExtendRequest, session: SessionDep,
           ctx: CtxDep) -> Reservation:
    return reservations.extend(session, reservation_id=reservation_id, request=body, ctx=ctx)


@router.post("/reservations/{reservation_id}/close", response_model=Reservation)
def close(reservation_id: str, body: CloseRequest, session: SessionDep,
          ctx: CtxDep) -> Reservation:
    return reservations.close(session, reservation_id=reservation_id, request=body, ctx=ctx)


@router.post("/reservations/{reservation_id}/central-images",
             response_model=CentralImagesRelease, status_code=201)
def central_images_release(reservation_id: str, body: CentralImagesRequest,
                           session: SessionDep, ctx: CtxDep) -> CentralImagesRelease:
    """A finetune's DP central-image release (DP-FETA warm-up), calibrated for
    ``target_epsilon`` and charged at once to EVERY training partition of the reservation's
    budget before the worker draws the noise (``dry_run``: only the plan); a chained
    ``central_images_released`` entry, or ``central_images_refused`` and 409
    ``privacy_budget_exhausted`` with the numbers. 409 ``conflict`` when the reservation
    belongs to another job or is closed; 400 ``invalid_request`` for an image shape the
    downsampling does not divide or an unreachable target."""
    return central_images.release(session, reservation_id=reservation_id, request=body,
                                  ctx=ctx)


# -- non-DP evaluation reads, recorded and never charged (service/evaluations.py) --------

@router.post("/evaluations", response_model=Evaluation, status_code=201)
def authorise_evaluation(body: EvaluationRequest, session: SessionDep,
                         ctx: CtxDep) -> Evaluation:
    """Authorise one non-DP evaluation read of the budget's private data (the api, when an
    evaluate job on a private reference is submitted); idempotent on ``job_id``; a chained
    ``evaluation_authorised`` entry, no epsilon."""
    return evaluations.authorise(session, request=body, ctx=ctx)


@router.post("/evaluations/{evaluation_id}/grant", response_model=ReadGrant, status_code=201)
def evaluation_grant(evaluation_id: str, body: EvaluationGrantRequest, session: SessionDep,
                     ctx: CtxDep) -> ReadGrant:
    """A short-lived read grant for the budget's private prefix (the worker of the evaluate
    job); a chained ``evaluation_read`` entry, no epsilon."""
    return evaluations.grant(session, evaluation_id=evaluation_id, request=body, ctx=ctx)


@router.post("/evaluations/{evaluation_id}/dp-releases", response_model=DpEvaluationRelease,
             status_code=201)
def dp_evaluation_release(evaluation_id: str, body: DpEvaluationRequest, session: SessionDep,
                          ctx: CtxDep) -> DpEvaluationRelease:
    """A DP evaluation release of the evaluate job, charged at once to the budget's HELD-OUT
    partition (``dry_run``: only the plan); a chained ``dp_evaluation_released`` entry."""
    return dp_evaluations.release(session, evaluation_id=evaluation_id, request=body, ctx=ctx)


@router.get("/datasets/{dataset_id}/evaluations", response_model=list[Evaluation])
def list_evaluations(dataset_id: str, session: SessionDep) -> list[Evaluation]:
    """The budget's evaluation reads, oldest first (``dataset_id``: the budget's id)."""
    return evaluations.list_for_dataset(session, dataset_id=dataset_id)


@router.post("/job-epsilon", response_model=JobEpsilon)
def job_epsilon(body: JobEpsilonRequest, session: SessionDep, ctx: CtxDep) -> JobEpsilon:
    return leases.job_epsilon(session, request=body, ctx=ctx)


@router.post("/gdp-envelopes", response_model=GdpEnvelope,
             summary="The Gaussian-DP envelope of a DP-SGD run (stateless)")
def gdp_envelope(body: GdpEnvelopeRequest, ctx: CtxDep) -> GdpEnvelope:
    """The smallest μ such that the run (σ, q, steps; add/remove, Poisson sampling) is
    μ-GDP by its PLD profile on a grid of ε, and that profile's δ at the grid's end
    (``tail_delta``): the claim a one-run privacy audit tests. Reads and writes nothing,
    charges nothing; computed in a heavy slot (503 ``ledger_busy`` with ``Retry-After``
    when none frees in time) and cached in the process. 422 ``plan_too_large`` beyond
    ``max_steps`` or below the σ floor, 422 ``invalid_spec`` when no envelope exists."""
    return gdp_envelopes.gdp_envelope(request=body, ctx=ctx)


@router.get("/chain/verify", response_model=VerifyReport)
def verify(session: SessionDep) -> VerifyReport:
    return verify_chain(session)


@router.get("/entries", response_model=list[LedgerEntry])
def entries(session: SessionDep, dataset_id: str | None = None,
            after_seq: Annotated[int, Query(ge=0)] = 0,
            limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[LedgerEntry]:
    rows = repo.entries(session, dataset_id=dataset_id, after_seq=after_seq, limit=limit)
    return [LedgerEntry(seq=e.seq, at=e.at, dataset_id=e.dataset_id, kind=e.kind,
                        payload=e.payload, prev_hash=e.prev_hash, hash=e.hash,
                        signature=e.signature, key_id=e.key_id) for e in rows]


# -- budget policies and per-dataset audits (service/policies.py) ------------------------

@router.post("/budgets/{dataset_id}/limit", response_model=BudgetView,
             responses={422: problem_schema_fields()})
def update_limit(dataset_id: str, body: LimitUpdate, session: SessionDep,
                 ctx: CtxDep) -> BudgetView:
    """Lower the epsilon limit (a raise is 422 ``policy_violation``) or set the warning
    fraction; a chained ``limit_lowered`` / ``warning_fraction_set`` entry."""
    return policies.update_limit(session, dataset_id=dataset_id, request=body, ctx=ctx)


@router.get("/budgets/{dataset_id}/verify", response_model=VerifyReport)
def verify_budget(dataset_id: str, session: SessionDep, ctx: CtxDep) -> VerifyReport:
    """The chain verification filtered to the dataset, with every epsilon recomputed."""
    return policies.verify_dataset(session, dataset_id=dataset_id, ctx=ctx)


@router.get("/budgets/{dataset_id}/recompute", response_model=RecomputeReport)
def recompute_budget(dataset_id: str, session: SessionDep, ctx: CtxDep) -> RecomputeReport:
    """Charges and figures recomputed with the current accountant code (a report only)."""
    return policies.recompute(session, dataset_id=dataset_id, ctx=ctx)


@router.get("/chain/key", response_model=ChainKey)
def chain_key(session: SessionDep) -> ChainKey:
    """The public half of the chain-signing key (an auditor checks entry signatures with it)."""
    return policies.chain_key(session)


# -- anchored history and restore (anchor.py, service/reconcile.py) ----------------------

@router.get("/anchor", response_model=AnchorStatus)
def anchor(session: SessionDep, ctx: CtxDep) -> AnchorStatus:
    """The database's chain head against the newest head in the append-only anchor."""
    if ctx.chain is None:
        raise DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, "the ledger has no anchor configured")
    return anchor_status(session, ctx.chain)


@router.post("/admin/reconcile", response_model=ReconcileReport)
def reconcile(body: ReconcileRequest, session: SessionDep, ctx: CtxDep) -> ReconcileReport:
    """After a restore: re-charge what the anchor and the api's jobs know and the database
    lost, close what cannot resume, and re-base the anchor (``dpsynth ledger
    reconcile-after-restore`` calls this through the api's admin endpoint)."""
    return reconciliation.reconcile(session, request=body, ctx=ctx)
