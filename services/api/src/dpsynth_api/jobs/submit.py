"""Submitting a job: admit its spec (its kind's rules, ``jobs/kinds/``), reserve budget,
insert, and send the worker task after the commit (docs/architecture.md "Job flow" 1).

Everything here is the same for every kind: what differs (inputs, privacy rules, what to
reserve or authorise at the ledger, the job's first result) is the kind's :class:`Admission`.
"""

from __future__ import annotations

import logging
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.errors import (
    REFUSAL_EXCEEDS,
    REFUSAL_EXHAUSTED,
    DpsynthError,
    ErrorCode,
    budget_refusal_detail,
    round_down,
)
from dpsynth_shared.ids import new_job_id
from dpsynth_shared.job_specs import JobSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.job_types import JobType
from dpsynth_shared.ledger_contract import Reservation, ReserveRequest
from dpsynth_shared.plan_limits import PlanLimits
from sqlalchemy.orm import Session

from dpsynth_api.jobs import repository as repo
from dpsynth_api.jobs.kinds import ADMISSIONS, Admission, AdmitContext
from dpsynth_api.jobs.schemas import DryRun, privacy_block
from dpsynth_api.jobs.service import transition
from dpsynth_api.jobs.states import Actor
from dpsynth_api.ports import LedgerPort, TaskSender
from dpsynth_api.tables import Job
from dpsynth_api.tenants.security import Principal

log = logging.getLogger(__name__)


def admit(session: Session, principal: Principal, spec: JobSpec, job_id: str,
          limits: PlanLimits) -> Admission:
    """The admission of ``spec`` by its kind (``jobs/kinds/``); it reserves nothing."""
    ctx = AdmitContext(session=session, principal=principal, job_id=job_id, limits=limits)
    return ADMISSIONS[JobType(spec.type)](ctx, spec)


def plan_job(session: Session, *, principal: Principal, ledger: LedgerPort,
             spec: JobSpec, limits: PlanLimits | None = None) -> DryRun:
    """``dry_run``: what the job would be and cost; nothing is stored or reserved."""
    admission = admit(session, principal, spec, new_job_id(), limits or PlanLimits())
    plan = admission.plan
    if admission.reserve is not None and admission.steps is not None:
        plan = privacy_block(ledger.plan(admission.reserve), reservation_id=None,
                             steps=admission.steps)
        plan.pop("reservation_id")
    return DryRun(type=spec.type, dataset_id=admission.dataset.id if admission.dataset else None,
                  model_id=admission.model_id, steps=admission.steps, plan=plan,
                  spec=spec.model_dump(mode="json"), warnings=admission.warnings)


def submit_job(session: Session, *, principal: Principal, ledger: LedgerPort,
               sender: TaskSender, spec: JobSpec,
               limits: PlanLimits | None = None) -> tuple[Job, bool]:
    """Insert a ``queued`` job (attempt 1) after reserving its budget, then send its task.

    A pretrain identical to one of the tenant's succeeded pretrains (``reuse``) returns that
    job instead: nothing is inserted, reserved or sent.

    Returns:
        The job, and whether it is an earlier job reused (True) rather than a new one.

    Raises:
        DpsynthError: 404 (inputs of another tenant), 422 ``visibility_mismatch`` /
            ``invalid_spec``, 409 ``privacy_budget_exhausted`` (the ledger's numbers).
    """
    job_id = new_job_id()
    admission = admit(session, principal, spec, job_id, limits or PlanLimits())
    if admission.reuse_of is not None:
        log.info("identical pretraining reused", extra={"reused_job_id": admission.reuse_of.id})
        return admission.reuse_of, True  # nothing inserted, reserved or sent
    privacy = None
    reservation_id = None
    if admission.authorise is not None:
        privacy = admission.authorise(ledger)  # before the row exists
    if admission.reserve is not None and admission.steps is not None:
        reservation = _reserve(ledger, admission.reserve)  # before the row exists
        reservation_id = reservation.reservation_id
        if reservation.plan is not None:
            privacy = privacy_block(reservation.plan, reservation_id=reservation_id,
                                    steps=admission.steps)
        else:
            privacy = _reservation_block(reservation, admission.steps)
    job = Job(id=job_id, tenant_id=principal.tenant_id, type=spec.type,
              spec=spec.model_dump(mode="json"), state=str(JobState.QUEUED), attempt=1,
              dataset_id=admission.dataset.id if admission.dataset else None,
              model_id=admission.model_id, progress_total=admission.steps or 0,
              reservation_id=reservation_id, privacy=privacy, result=admission.result)
    try:
        repo.add(session, job)
        session.commit()
    except BaseException:
        session.rollback()
        if reservation_id is not None:
            # Not a transition (so not a declared effect, jobs/states.py): the job row was
            # never stored, so there is no state to change; only the reservation made for
            # it above is released.
            ledger.close_reservation(reservation_id, "cancelled")
        raise
    _send(session, ledger=ledger, sender=sender, job=job)
    return job, False


TARGET_FIELD = "privacy.target_epsilon"
"""Where a job spec sets the target a budget refusal asks to lower."""


def _reserve(ledger: LedgerPort, request: ReserveRequest) -> Reservation:
    """The ledger's reservation; its budget refusal is told in the job spec's terms."""
    try:
        return ledger.reserve(request)
    except DpsynthError as exc:
        if exc.code != ErrorCode.PRIVACY_BUDGET_EXHAUSTED:
            raise
        raise spec_refusal(exc) from exc


def spec_refusal(error: DpsynthError) -> DpsynthError:
    """A budget refusal naming the spec key the user lowers (``privacy.target_epsilon``),
    with the same numbers and code. A refusal without ``refusal`` (an older ledger) gets it
    from its largest admissible target; one without the numbers is passed on as it is."""
    ext = dict(error.extensions)
    if "refusal" not in ext:
        best = ext.get("max_admissible_target_epsilon")
        if not isinstance(ext.get("target_epsilon"), int | float):
            return error
        usable = best if isinstance(best, int | float) and best > 0 else None
        ext["refusal"] = REFUSAL_EXCEEDS if usable is not None else REFUSAL_EXHAUSTED
        ext["suggested_target_epsilon"] = round_down(usable) if usable is not None else None
    ext["field"] = TARGET_FIELD
    return DpsynthError(error.code, budget_refusal_detail(ext, field=TARGET_FIELD), **ext)


def _reservation_block(reservation: Reservation, steps: int) -> dict[str, Any]:
    """The privacy figures of a reservation returned without its plan (a resent request)."""
    block: dict[str, Any] = {"reservation_id": reservation.reservation_id,
                             "job_epsilon": reservation.job_epsilon, "steps": steps}
    if reservation.per_label is None:
        event = reservation.event
        assert isinstance(event, DpSgdEvent)
        return {**block, "noise_multiplier": event.noise_multiplier,
                "sample_rate": event.sample_rate}
    return {**block, "noise_multiplier": None, "sample_rate": None, "per_label": {
        name: {"noise_multiplier": part.event.noise_multiplier,
               "sample_rate": part.event.sample_rate, "steps": part.steps_reserved,
               "expected_batch_size": part.expected_batch_size,
               "class_size": part.class_size, "job_epsilon": part.job_epsilon}
        for name, part in reservation.per_label.items()}}


def _send(session: Session, *, ledger: LedgerPort, sender: TaskSender, job: Job) -> None:
    """Send the task after the commit; when the broker refuses, fail the job and release
    its reservation rather than leave it queued with no message."""
    try:
        sender.send_run_job(job.id, job.attempt)
        return
    except Exception:
        log.exception("could not send the job's task", extra={"job_id": job.id})
    # queued -> failed by the api closes the reservation 'cancelled' (jobs/states.py)
    outcome = transition(session, job_id=job.id, to_state=JobState.FAILED, actor=Actor.REAPER,
                         ledger=ledger)
    if outcome.accepted:
        outcome.job.error_code = str(ErrorCode.SERVICE_UNAVAILABLE)
        outcome.job.error_message = "the job queue could not be reached"
    session.commit()
    raise DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, "the job queue could not be reached; "
                       "the job was not started and its budget was released", job_id=job.id)
