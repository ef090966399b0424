"""Use cases: non-DP evaluation reads of a budget's private data (recorded, never charged).

An ``evaluate`` job on a PRIVATE reference dataset reads the private records themselves (its
real test data) and releases metrics computed from them to the data's owner only, labelled
non-DP. It spends no epsilon, so it does not go through the RDP filter; but a read of private
data must never be invisible in the audit trail. So:

* the api authorises each such job once (:func:`authorise`, idempotent on ``job_id``): an
  :class:`~dpsynth_ledger.models.EvaluationRow` and a chained ``evaluation_authorised`` entry;
* the worker then takes short-lived read grants for the budget's private prefix
  (:func:`grant`): each one is a chained ``evaluation_read`` entry, counted on the row.

Both entries are hash-chained, signed and anchored like every other entry (``append_entry``
refuses them with 503 ``ledger_behind_anchor`` while the database is behind its anchor) and
carry the dataset's accumulators and figures UNCHANGED (``accumulators_after``, ``figures``)
and no ``rdp_delta``: verify's replay, the per-dataset verification and the recompute report
all see them and count nothing; reconciliation re-records a lost one without a charge.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.grants import GrantClaims, private_dataset_prefix, sign_grant
from dpsynth_shared.ids import new_id
from dpsynth_shared.ledger_contract import ReadGrant
from dpsynth_shared.release_contract import Evaluation, EvaluationGrantRequest, EvaluationRequest
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.book import figures, snapshot
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget, EvaluationRow

AUTHORISED = "evaluation_authorised"
READ = "evaluation_read"
KINDS = (AUTHORISED, READ)
"""The entry kinds of evaluation reads: informational, never a charge."""

ID_PREFIX = "evl"
"""Prefix of evaluation ids (``evl_<32 hex>``, the shape of every dpsynth id)."""


def new_evaluation_id() -> str:
    """A fresh evaluation id (also the ``reservation_id`` of its read grants)."""
    return f"{ID_PREFIX}_{uuid.uuid4().hex}"


def view(row: EvaluationRow) -> Evaluation:
    """The contract's view of a row."""
    return Evaluation(evaluation_id=row.evaluation_id, dataset_id=row.dataset_id,
                      job_id=row.job_id, reference_dataset_id=row.reference_dataset_id,
                      requested_by=row.requested_by, purpose=row.purpose,
                      created_at=row.created_at, touched_at=row.touched_at, grants=row.grants)


def unchanged_figures(session: Session, budget: Budget) -> dict[str, Any]:
    """The part of an evaluation entry that shows it changed nothing: the dataset's
    accumulators and filter figures as they stand (replay checks them like any other)."""
    accs = repo.accumulators(session, budget.dataset_id)
    return {"non_dp": True, "rdp_charged": 0.0, "accumulators_after": snapshot(accs),
            "figures": figures(budget, accs)}


def _by_job(session: Session, job_id: str) -> EvaluationRow | None:
    stmt = select(EvaluationRow).where(EvaluationRow.job_id == job_id)
    return session.execute(stmt).scalar_one_or_none()


def _same_request(row: EvaluationRow, request: EvaluationRequest) -> Evaluation:
    """An idempotent repeat returns the existing authorisation; a different one is refused.

    Raises:
        DpsynthError: 409 ``conflict`` when the job id was authorised for other data.
    """
    if (row.dataset_id, row.reference_dataset_id) != (request.dataset_id,
                                                      request.reference_dataset_id):
        raise DpsynthError(ErrorCode.CONFLICT, "this job already has an evaluation "
                           "authorisation on other data", evaluation_id=row.evaluation_id)
    return view(row)


def authorise(session: Session, *, request: EvaluationRequest,
              ctx: LedgerContext) -> Evaluation:
    """Record the authorisation of one non-DP evaluation read of the budget's data.

    Idempotent on ``job_id`` (a retried submission gets the same evaluation and writes no
    second entry). Decided under the budget-row lock, like every write on a dataset.

    Raises:
        NotFound: 404 for an unknown budget.
        DpsynthError: 409 ``conflict`` for a job id authorised on other data; 503
            ``ledger_behind_anchor`` while the database is behind its anchor.
    """
    existing = _by_job(session, request.job_id)
    if existing is not None:
        return _same_request(existing, request)
    session.commit()  # end the read transaction: decide under the lock only
    budget = repo.lock_budget(session, request.dataset_id)
    if budget is None:
        session.rollback()
        raise NotFound("budget", request.dataset_id)
    existing = _by_job(session, request.job_id)
    if existing is not None:
        session.commit()
        return _same_request(existing, request)
    row = EvaluationRow(evaluation_id=new_evaluation_id(), dataset_id=budget.dataset_id,
                        job_id=request.job_id,
                        reference_dataset_id=request.reference_dataset_id,
                        requested_by=request.requested_by, purpose=request.purpose,
                        created_at=datetime.now(UTC), touched_at=None, grants=0)
    session.add(row)
    session.flush()
    append_entry(session, dataset_id=budget.dataset_id, kind=AUTHORISED, payload={
        "evaluation_id": row.evaluation_id, "job_id": row.job_id,
        "reference_dataset_id": row.reference_dataset_id, "requested_by": row.requested_by,
        "purpose": row.purpose, **unchanged_figures(session, budget)})
    session.commit()
    ctx.metrics.evaluations_authorised.inc()
    return view(row)


def grant(session: Session, *, evaluation_id: str, request: EvaluationGrantRequest,
          ctx: LedgerContext) -> ReadGrant:
    """A signed read grant for the budget's private prefix, recorded as ``evaluation_read``.

    The grant's ``reservation_id`` is the evaluation id (the object store checks only the
    signature, the expiry and the prefix); it expires after the ledger's lease TTL, like a
    reservation's read grant, so a worker asks again for a later read.

    Raises:
        NotFound: 404 for an unknown evaluation.
        DpsynthError: 503 ``ledger_behind_anchor`` while the database is behind its anchor.
    """
    row = session.get(EvaluationRow, evaluation_id)
    if row is None:
        raise NotFound("evaluation", evaluation_id)
    dataset_id = row.dataset_id
    session.commit()
    budget = repo.lock_budget(session, dataset_id)
    row = session.get(EvaluationRow, evaluation_id, populate_existing=True)
    assert budget is not None and row is not None
    now = datetime.now(UTC)
    expires_at = now + timedelta(seconds=ctx.lease_ttl_s)
    claims = GrantClaims(grant_id=new_id("grant"), dataset_id=budget.dataset_id,
                         reservation_id=row.evaluation_id, job_id=row.job_id,
                         attempt=request.attempt, expires_at=expires_at.timestamp())
    row.grants += 1
    if row.touched_at is None:
        row.touched_at = now
    session.flush()
    append_entry(session, dataset_id=budget.dataset_id, kind=READ, payload={
        "evaluation_id": row.evaluation_id, "job_id": row.job_id,
        "reference_dataset_id": row.reference_dataset_id, "attempt": request.attempt,
        "worker_id": request.worker_id, "grant_id": claims.grant_id,
        "prefix": private_dataset_prefix(budget.dataset_id),
        "expires_at": expires_at.isoformat(), "grants": row.grants,
        **unchanged_figures(session, budget)})
    session.commit()
    ctx.metrics.evaluation_reads.inc()
    return ReadGrant(token=sign_grant(claims, ctx.signing_key), dataset_id=budget.dataset_id,
                     reservation_id=row.evaluation_id, attempt=request.attempt,
                     expires_at=expires_at)


def list_for_dataset(session: Session, *, dataset_id: str) -> list[Evaluation]:
    """The budget's evaluation reads, oldest first.

    Raises:
        NotFound: 404 for an unknown budget.
    """
    if repo.get_budget(session, dataset_id) is None:
        raise NotFound("budget", dataset_id)
    stmt = (select(EvaluationRow).where(EvaluationRow.dataset_id == dataset_id)
            .order_by(EvaluationRow.created_at, EvaluationRow.evaluation_id))
    return [view(r) for r in session.execute(stmt).scalars()]


def restore(session: Session, budget: Budget, kind: str, payload: dict[str, Any],
            origin: dict[str, Any], at: datetime | None) -> int:
    """Re-record one lost anchored evaluation entry (reconciliation after a restore).

    An authorisation re-creates its row when the database lacks it; a read counts on the
    row. Either is written again as a new entry of its own kind naming ``restored_from``,
    with the dataset's current (unchanged) figures: nothing is ever charged.

    Returns:
        1 (one entry written).
    """
    evaluation_id = str(payload["evaluation_id"])
    row = session.get(EvaluationRow, evaluation_id)
    if row is None and kind == AUTHORISED and _by_job(session, str(payload["job_id"])) is None:
        row = EvaluationRow(evaluation_id=evaluation_id, dataset_id=budget.dataset_id,
                            job_id=str(payload["job_id"]),
                            reference_dataset_id=str(payload["reference_dataset_id"]),
                            requested_by=str(payload["requested_by"]),
                            purpose=str(payload.get("purpose", "evaluate")),
                            created_at=at or datetime.now(UTC), touched_at=None, grants=0)
        session.add(row)
    elif row is not None and kind == READ:
        row.grants += 1
        if row.touched_at is None:
            row.touched_at = at or datetime.now(UTC)
    session.flush()
    kept = {k: v for k, v in payload.items()
            if k not in ("v", "at", "dataset_id", "kind", "accumulators_after", "figures",
                         "restored_from")}
    append_entry(session, dataset_id=budget.dataset_id, kind=kind, payload={
        **kept, **unchanged_figures(session, budget), "restored_from": origin})
    return 1
