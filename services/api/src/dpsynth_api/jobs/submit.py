"""Submitting a job: resolve its inputs, check the privacy rules, reserve budget, insert,
and send the worker task after the commit (docs/architecture.md "Job flow" 1)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
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
from dpsynth_shared.job_specs import (
    EvaluateSpec,
    FeatureNetSpec,
    FinetuneSpec,
    GenerateSpec,
    PretrainSpec,
    steps_for,
)
from dpsynth_shared.job_states import Actor, JobState
from dpsynth_shared.ledger_contract import (
    LabelShape,
    Reservation,
    ReserveRequest,
)
from dpsynth_shared.plan_limits import PlanLimits, check_plan_size
from dpsynth_shared.release_contract import EvaluationRequest
from sqlalchemy.orm import Session

from dpsynth_api.datasets.derive import check_not_deleted
from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.jobs import evaluations
from dpsynth_api.jobs import repository as repo
from dpsynth_api.jobs.eval_overlap import HoldoutCheck
from dpsynth_api.jobs.layouts import layout_record, resolve_layout_source
from dpsynth_api.jobs.options import check_finetune_options
from dpsynth_api.jobs.schemas import DryRun, privacy_block
from dpsynth_api.jobs.service import transition
from dpsynth_api.models.conditioning import layout_channels
from dpsynth_api.models.service import get_model
from dpsynth_api.ports import LedgerPort, TaskSender
from dpsynth_api.tables import Dataset, Job, Model
from dpsynth_api.tenants.security import Principal

log = logging.getLogger(__name__)
AnySpec = PretrainSpec | FinetuneSpec | GenerateSpec | FeatureNetSpec | EvaluateSpec


@dataclass
class _Resolved:
    dataset: Dataset | None = None
    model_id: str | None = None
    steps: int | None = None
    reserve: ReserveRequest | None = None
    layout: Dataset | Model | None = None  # generate: the public dataset of the layout
    # masks, or the layout generator that draws them
    evaluate: bool = False  # evaluate: a private reference needs the ledger's authorisation
    holdout_check: HoldoutCheck | None = None  # evaluate: the held-out overlap check
    warnings: list[str] = field(default_factory=list)  # shown by the dry run


def _require_visibility(dataset: Dataset, wanted: str, job_type: str) -> None:
    if dataset.visibility == wanted:
        return
    why = ("pretrain jobs train without differential privacy, so they only accept PUBLIC "
           "datasets; use a finetune job for private data") if job_type == "pretrain" else (
           "finetune jobs are the DP path for PRIVATE datasets; train on public data with "
           "a pretrain job")
    raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH,
                       f"dataset {dataset.id} is {dataset.visibility}: {why}",
                       dataset_visibility=dataset.visibility, job_type=job_type)


def _require_masks_for_target(dataset: Dataset, target: str) -> None:
    """A layout generator (target 'masks') trains on the dataset's masks: it must have them."""
    if target == "masks" and not dataset.has_masks:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"target 'masks' trains a layout generator on the dataset's layout "
                           f"masks, and dataset {dataset.id} carries none", dataset_id=dataset.id)


def _resolve(session: Session, principal: Principal, spec: AnySpec, job_id: str,
             limits: PlanLimits) -> _Resolved:
    if isinstance(spec, FeatureNetSpec):
        return _Resolved(dataset=evaluations.resolve_feature_net(session, principal, spec))
    if isinstance(spec, EvaluateSpec):
        reference, _, _, check = evaluations.resolve_evaluate(session, principal, spec)
        return _Resolved(dataset=reference, evaluate=True, holdout_check=check)
    if isinstance(spec, PretrainSpec):
        dataset = get_dataset(session, principal=principal, dataset_id=spec.dataset_id)
        check_not_deleted(dataset)
        _require_visibility(dataset, "public", "pretrain")
        _require_masks_for_target(dataset, spec.target)
        return _Resolved(dataset=dataset)
    if isinstance(spec, GenerateSpec):
        model = get_model(session, principal=principal, model_id=spec.model_id)
        evaluations.refuse_feature_net(model, "model a generate job samples")
        if model.rng == "test":
            # docs/privacy.md: a model trained with a test-injected seeded generator has
            # predictable noise; its outputs carry no DP guarantee and are never released.
            raise DpsynthError(ErrorCode.NOT_PUBLISHABLE,
                               f"model {model.id} was trained with a test random generator "
                               "(rng: test); its samples can never be published")
        layout = resolve_layout_source(session, principal=principal, spec=spec, model=model)
        return _Resolved(model_id=model.id, layout=layout)
    dataset = get_dataset(session, principal=principal, dataset_id=spec.dataset_id)
    check_not_deleted(dataset)
    _require_visibility(dataset, "private", "finetune")
    check_finetune_options(dataset, spec)
    _require_masks_for_target(dataset, spec.training.target)
    base = get_model(session, principal=principal, model_id=spec.base_model_id)
    evaluations.refuse_feature_net(base, "base model of a finetune job")
    if spec.training.target == "masks" and layout_channels(base.info or {}):
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"model {base.id} is layout-conditioned: a layout generator (target "
                           "'masks') starts from a model without layout conditioning",
                           model_id=base.id)
    batch = spec.training.expected_batch_size
    budget_id, population = budget_terms(dataset)
    if spec.training.per_label:
        if population is not None:
            raise DpsynthError(ErrorCode.INVALID_SPEC,
                               f"dataset {dataset.id} charges the budget of dataset "
                               f"{budget_id}; per-label jobs run only on the dataset that "
                               "owns its budget (the budget's class partitions and sizes are "
                               "that dataset's)", dataset_id=dataset.id, budget_id=budget_id)
        shapes = per_label_shapes(dataset, spec)
        reserve = ReserveRequest(job_id=job_id, dataset_id=budget_id,
                                 target_epsilon=spec.privacy.target_epsilon, per_label=shapes)
        check_plan_size(reserve, limits)  # the ledger's bounds (api setting), refused early
        return _Resolved(dataset=dataset, model_id=base.id, reserve=reserve,
                         steps=sum(shape.steps for shape in shapes.values()))
    if batch > dataset.declared_size:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"expected_batch_size {batch} exceeds the dataset's declared size "
                           f"N̂ = {dataset.declared_size} (the sample rate q = batch / N̂ "
                           "must be at most 1)", declared_size=dataset.declared_size)
    steps = steps_for(epochs=spec.training.epochs, expected_batch_size=batch,
                      declared_size=dataset.declared_size)
    reserve = ReserveRequest(job_id=job_id, dataset_id=budget_id,
                             target_epsilon=spec.privacy.target_epsilon,
                             expected_batch_size=batch, steps=steps, population_size=population)
    check_plan_size(reserve, limits)  # the ledger's bounds (api setting), refused early
    return _Resolved(dataset=dataset, model_id=base.id, steps=steps, reserve=reserve,
                     warnings=_class_table_warnings(dataset, base, spec))


def _class_table_warnings(dataset: Dataset, base: Model, spec: FinetuneSpec) -> list[str]:
    """A finetune without ``class_map`` learns the class table afresh under DP; when the
    base model was pretrained on classes of the same names, keeping its table is almost
    always meant (a short DP run learns a fresh one poorly: near-chance samples). Public
    facts only: the dataset's declared class names and the model's."""
    training = spec.training
    base_names = (base.info or {}).get("class_names") or []
    if training.class_map is not None or not training.class_conditional or not base_names:
        return []
    same = [name for name in dataset.class_names if name in base_names]
    if len(same) != len(dataset.class_names):
        return []
    example = ", ".join(f'"{n}": "{n}"' for n in same[:3]) + (", ..." if len(same) > 3 else "")
    return [f"the base model {base.id} was pretrained on the same classes, but without "
            "training.class_map this job learns a fresh class table under DP, which a short "
            "DP run does poorly (samples near chance); to keep the base model's table set "
            f"training.class_map {{{example}}} (each class to its own name)"]


def budget_terms(dataset: Dataset) -> tuple[str, int | None]:
    """The ledger budget a job on ``dataset`` charges and the population it samples from.

    A derived or linked dataset charges its parent's budget (``budget_id``) with its own
    public size N̂ (``population_size``: the ledger sets q = expected_batch_size / N̂ of the
    child); a dataset that owns its budget passes None (the budget's declared size).
    """
    budget_id = dataset.budget_id or dataset.id
    return budget_id, (dataset.declared_size if budget_id != dataset.id else None)


def per_label_shapes(dataset: Dataset, spec: FinetuneSpec) -> dict[str, LabelShape]:
    """Each class's run of a per-label finetune, from the dataset's public class sizes.

    Class c trains on its N̂_c declared records with expected batch size
    ``min(expected_batch_size, N̂_c)`` for ``steps_for(epochs, batch_c, N̂_c)`` logical steps;
    the ledger sets q_c = batch_c / N̂_c from the same declared sizes.

    Raises:
        DpsynthError: 422 ``invalid_spec`` when the dataset declares no class sizes (they
            are never read from the data).
    """
    sizes = dataset.class_sizes
    if not sizes:
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           f"training.per_label needs public class sizes, and dataset "
                           f"{dataset.id} declares none: each class's sample rate is set by "
                           "its declared size, never read from the data. Upload the dataset "
                           "with class_sizes in its metadata (every class, each at least its "
                           "true count)", dataset_id=dataset.id)
    t = spec.training
    shapes: dict[str, LabelShape] = {}
    for name in dataset.class_names:
        size = int(sizes[name])
        batch = min(t.expected_batch_size, size)
        shapes[name] = LabelShape(expected_batch_size=batch, steps=steps_for(
            epochs=t.epochs, expected_batch_size=batch, declared_size=size))
    return shapes


def plan_job(session: Session, *, principal: Principal, ledger: LedgerPort,
             spec: AnySpec, limits: PlanLimits | None = None) -> DryRun:
    """``dry_run``: what the job would be and cost; nothing is stored or reserved."""
    resolved = _resolve(session, principal, spec, new_job_id(), limits or PlanLimits())
    plan: dict[str, Any] | None = None
    if resolved.evaluate and resolved.dataset is not None:
        plan = evaluations.evaluation_privacy(resolved.dataset, None, spec,
                                              check=resolved.holdout_check)
    if resolved.reserve is not None and resolved.steps is not None:
        plan = privacy_block(ledger.plan(resolved.reserve), reservation_id=None,
                             steps=resolved.steps)
        plan.pop("reservation_id")
    return DryRun(type=spec.type, dataset_id=resolved.dataset.id if resolved.dataset else None,
                  model_id=resolved.model_id, steps=resolved.steps, plan=plan,
                  spec=spec.model_dump(mode="json"), warnings=resolved.warnings)


def submit_job(session: Session, *, principal: Principal, ledger: LedgerPort,
               sender: TaskSender, spec: AnySpec, limits: PlanLimits | None = None) -> Job:
    """Insert a ``queued`` job (attempt 1) after reserving its budget, then send its task.

    Raises:
        DpsynthError: 404 (inputs of another tenant), 422 ``visibility_mismatch`` /
            ``invalid_spec``, 409 ``privacy_budget_exhausted`` (the ledger's numbers).
    """
    job_id = new_job_id()
    resolved = _resolve(session, principal, spec, job_id, limits or PlanLimits())
    privacy = None
    reservation_id = None
    if resolved.evaluate and resolved.dataset is not None:
        privacy = _authorise_evaluation(ledger, principal, resolved.dataset, job_id, spec,
                                        resolved.holdout_check)
    if resolved.reserve is not None and resolved.steps is not None:
        reservation = _reserve(ledger, resolved.reserve)  # before the row exists
        reservation_id = reservation.reservation_id
        if reservation.plan is not None:
            privacy = privacy_block(reservation.plan, reservation_id=reservation_id,
                                    steps=resolved.steps)
        else:
            privacy = _reservation_block(reservation, resolved.steps)
    job = Job(id=job_id, tenant_id=principal.tenant_id, type=spec.type,
              spec=spec.model_dump(mode="json"), state=str(JobState.QUEUED), attempt=1,
              dataset_id=resolved.dataset.id if resolved.dataset else None,
              model_id=resolved.model_id, progress_total=resolved.steps or 0,
              reservation_id=reservation_id, privacy=privacy,
              result=_initial_result(spec, resolved))
    try:
        repo.add(session, job)
        session.commit()
    except BaseException:
        session.rollback()
        if reservation_id is not None:
            ledger.close_reservation(reservation_id, "cancelled")
        raise
    _send(session, ledger=ledger, sender=sender, job=job)
    return job


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


def _authorise_evaluation(ledger: LedgerPort, principal: Principal, dataset: Dataset,
                          job_id: str, spec: AnySpec,
                          check: HoldoutCheck | None) -> dict[str, Any]:
    """An evaluate job's privacy block; on a PRIVATE reference the ledger first records the
    non-DP read (before the job row exists: a read is never unrecorded, at worst an
    authorisation is recorded for a job that never ran)."""
    evaluation_id = None
    if dataset.visibility == "private":
        budget_id, _ = budget_terms(dataset)
        evaluation = ledger.authorise_evaluation(EvaluationRequest(
            dataset_id=budget_id, job_id=job_id, reference_dataset_id=dataset.id,
            requested_by=principal.key_id))
        evaluation_id = evaluation.evaluation_id
    return evaluations.evaluation_privacy(dataset, evaluation_id, spec, check=check)


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


def _initial_result(spec: AnySpec, resolved: _Resolved) -> dict[str, Any]:
    """What the api records in a new job's result: a generate job's layout source (the
    public dataset and who declared it public, or the layout generator), which a worker's
    result never replaces."""
    if isinstance(spec, GenerateSpec) and spec.layout_source and resolved.layout:
        return {"layout_source": layout_record(resolved.layout,
                                               per_class=spec.layout_source.per_class)}
    return {}


def _send(session: Session, *, ledger: LedgerPort, sender: TaskSender, job: Job) -> None:
    """Send the task after the commit; when the broker refuses, fail the job and release
    its reservation rather than leave it queued with no message."""
    try:
        sender.send_run_job(job.id, job.attempt)
        return
    except Exception:
        log.exception("could not send the job's task", extra={"job_id": job.id})
    outcome = transition(session, job_id=job.id, to_state=JobState.FAILED, actor=Actor.REAPER)
    if outcome.accepted:
        outcome.job.error_code = str(ErrorCode.SERVICE_UNAVAILABLE)
        outcome.job.error_message = "the job queue could not be reached"
        if outcome.job.reservation_id:
            ledger.close_reservation(outcome.job.reservation_id, "cancelled")
    session.commit()
    raise DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, "the job queue could not be reached; "
                       "the job was not started and its budget was released", job_id=job.id)
