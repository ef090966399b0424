"""Direct DP training of a downstream classifier on a private dataset (issue 20; PrIeD-KIE's
question: would the user do better training their model directly with DP?).

Like a whole-dataset finetune (:mod:`dpsynth_worker.runners.finetune`): the DP parameters
(noise multiplier, q, expected batch size, steps) come from the ledger's reservation
verbatim, the private dataset is read with a read grant, steps are leased in chunks before
they run (:class:`~dpsynth_worker.runners.hooks.LeasedHooks`), every chunk ends with a
checkpoint that a later attempt resumes from, and on success the model's job epsilon comes
from the ledger for the steps on the model's own path. The model is a classifier folder
(``dpsynth_ml.dp_train``: safetensors weights and their info), registered with
``model_kind: classifier``. It runs on the worker's first device.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.dp_train_specs import DpTrainSpec
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ids import new_model_id
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import Reservation
from dpsynth_shared.worker_contract import DatasetInfo

from dpsynth_worker.devices import first_device
from dpsynth_worker.ports import StepsUsed
from dpsynth_worker.runners.artifacts import (
    download_folder,
    model_key,
    tar_folder,
    upload_and_register,
    write_provenance,
)
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.finetune import _upload_private_stats, epsilon_labels
from dpsynth_worker.runners.hooks import LeasedHooks
from dpsynth_worker.runners.outcome import (
    Outcome,
    close_reservation,
    propose,
    unfinished_training,
)
from dpsynth_worker.runners.selection import fetch_dataset
from dpsynth_worker.runners.training_specs import planned_steps

if TYPE_CHECKING:
    from dpsynth_ml import ClassifierTraining, TrainingResult

log = logging.getLogger(__name__)


def run_dp_train(ctx: JobContext) -> Outcome:
    """Run one attempt of a dp_train job; see ``docs/dp-train.md``."""
    claim = ctx.claim
    if claim.reservation_id is None or claim.dataset is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a dp_train claim needs a reservation "
                           "and a dataset")
    if claim.dataset.visibility != "private":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH, "a dp_train job needs a private "
                           "dataset")
    spec = DpTrainSpec.model_validate(claim.spec)
    reservation = ctx.ledger.get_reservation(claim.reservation_id)
    training = classifier_training_spec(spec, reservation=reservation, dataset=claim.dataset)
    ctx.heartbeat.phase("downloading")
    resume_dir = (download_folder(ctx, claim.resume_checkpoint_key, "resume")
                  if claim.resume_checkpoint_key else None)
    data_path = ctx.work_dir / "data.npz"
    grant = ctx.ledger.read_grant(reservation.reservation_id, attempt=ctx.attempt,
                                  worker_id=ctx.worker_id)
    fetch_dataset(ctx, claim.dataset, data_path, grant=grant.token)
    hooks = LeasedHooks(ctx, reservation.reservation_id)
    ctx.heartbeat.phase("training")
    try:
        result = ctx.ml.dp_train_classifier(training, dataset_path=data_path,
                                            out_dir=ctx.work_dir / "out", hooks=hooks,
                                            resume_from=resume_dir,
                                            device=first_device(ctx.ml.devices))
    finally:
        _upload_private_stats(ctx, hooks)
    unfinished = unfinished_training(ctx, hooks, stopped_early=result.stopped_early,
                                     steps=result.steps_completed)
    if unfinished is not None:
        return unfinished
    return _succeed(ctx, spec, reservation, claim.dataset, result)


def classifier_training_spec(spec: DpTrainSpec, *, reservation: Reservation,
                             dataset: DatasetInfo) -> ClassifierTraining:
    """The ML core's spec: the classifier from the job's spec, the DP parameters from the
    reservation verbatim, the privacy unit from the dataset's row.

    Raises:
        DpsynthError: ``invalid_spec`` for a reservation that is not one DP-SGD run.
    """
    from dpsynth_ml import ClassifierTraining, DpSpec, RecordLevel, SubjectLevel

    event = reservation.event
    if not isinstance(event, DpSgdEvent) or reservation.expected_batch_size is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a dp_train job's reservation is one "
                           "DP-SGD run")
    t = spec.training
    limit, delta = dataset.epsilon_limit, dataset.delta
    epsilon = spec.privacy.target_epsilon if limit is None else max(
        spec.privacy.target_epsilon, limit)
    dp = DpSpec(noise_multiplier=event.noise_multiplier, sample_rate=event.sample_rate,
                expected_batch_size=reservation.expected_batch_size,
                max_grad_norm=spec.privacy.max_grad_norm, steps=planned_steps(reservation),
                epsilon=epsilon, delta=delta)
    privacy = (SubjectLevel(dp, max_images_per_subject=t.max_images_per_subject)
               if dataset.privacy_unit == "subject" else RecordLevel(dp))
    return ClassifierTraining(architecture=t.architecture, image_size=t.image_size,
                              channels=t.channels, privacy=privacy, optimizer=t.optimizer,
                              learning_rate=t.learning_rate,
                              max_physical_batch_size=t.max_physical_batch_size,
                              checkpoint_every=t.checkpoint_every)


def _succeed(ctx: JobContext, spec: DpTrainSpec, reservation: Reservation,
             dataset: DatasetInfo, result: TrainingResult) -> Outcome:
    """Job epsilon from the ledger, publish the classifier, close the reservation, propose."""
    rid = reservation.reservation_id
    budget_id = dataset.budget_id or dataset.dataset_id
    steps_used: StepsUsed = {rid: int(result.steps_completed)}
    spent = ctx.ledger.budget_view(budget_id).dataset_epsilon_spent
    eps = ctx.ledger.job_epsilon(dataset_id=budget_id, reservation_ids=[rid],
                                 steps_used=steps_used)
    event, plan = reservation.event, reservation.plan
    record: dict[str, object] = {
        "dp": True, "model_kind": "classifier", "task": spec.task,
        "dataset_id": dataset.dataset_id, "reservation_ids": [rid], "job_ids": [ctx.job_id],
        "job_epsilon": eps.job_epsilon, "delta": eps.delta, **epsilon_labels([], spent),
        "accountant": plan.accountant if plan else None,
        "noise_multiplier": getattr(event, "noise_multiplier", None),
        "sample_rate": getattr(event, "sample_rate", None), "steps": result.steps_completed,
        "expected_batch_size": reservation.expected_batch_size,
        "max_grad_norm": spec.privacy.max_grad_norm, "steps_used": steps_used,
        "privacy_unit": dataset.privacy_unit,
        "training": spec.training.model_dump(mode="json")}
    ctx.heartbeat.phase("uploading model")
    folder = result.model_dir
    write_provenance(folder, record)
    digest = ctx.ml.model_hash(folder)
    model_id = new_model_id()
    archive = tar_folder(folder, ctx.work_dir / "model.tar")
    t = spec.training
    registered = upload_and_register(ctx, key=model_key(model_id), path=archive, kind="model",
                                     metadata={
        **record, "model_id": model_id, "model_hash": digest, "rng": result.rng,
        "class_names": list(dataset.class_names), "image_size": t.image_size,
        "channels": t.channels, "architecture": t.architecture, "training_kind": "dp_train",
        "trainable_parameters": result.trainable_parameters})
    archive.unlink()
    close_reservation(ctx, "succeeded")
    propose(ctx, JobState.SUCCEEDED, result={
        "model_id": registered.model_id or model_id, "artifact_id": registered.artifact_id,
        "model_hash": digest, "job_epsilon": eps.job_epsilon, "delta": eps.delta,
        **epsilon_labels([], spent), "steps_used": steps_used,
        "trainable_parameters": result.trainable_parameters,
        "device": str(result.device).split(":", 1)[0], "world_size": 1})
    log.info("dp_train succeeded", extra={"steps": result.steps_completed})
    return Outcome.SUCCEEDED
