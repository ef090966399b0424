"""DP fine-tuning on a private dataset under step leases (docs/privacy.md; DP-LDMs, Liu et al.).

The DP parameters (noise multiplier, sample rate q, expected batch size, steps) come from
the ledger's reservation and are handed to the trainer verbatim: the worker never
recomputes them, so what runs is exactly what was accounted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FinetuneSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import LINEAGE_LABEL, Reservation
from dpsynth_shared.release_contract import CentralImagesRelease, CentralImagesRequest
from dpsynth_shared.worker_contract import DatasetInfo, ModelRef

from dpsynth_worker.ports import JobEpsilon, StepsUsed
from dpsynth_worker.runners.artifacts import (
    download_folder,
    private_stats_key,
    read_provenance,
    upload_and_register,
)
from dpsynth_worker.runners.central_images import calibrate, release_request
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.hooks import LeasedHooks
from dpsynth_worker.runners.outcome import (
    Outcome,
    close_reservation,
    propose,
    unfinished_training,
)
from dpsynth_worker.runners.publish import publish_model
from dpsynth_worker.runners.selection import fetch_dataset
from dpsynth_worker.runners.training_specs import finetune_training_spec

if TYPE_CHECKING:
    from dpsynth_ml import ModelInfo, TrainingResult, TrainingSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Inputs:
    spec: FinetuneSpec
    reservation: Reservation
    dataset: DatasetInfo
    base: ModelRef
    base_dir: Path
    data_path: Path
    resume_dir: Path | None
    ancestors: list[str]


def run_finetune(ctx: JobContext) -> Outcome:
    """Run one attempt of a DP finetune; see ``docs/architecture.md`` ("Job flow")."""
    inputs = _fetch_inputs(ctx)
    # bad specs fail before private data is touched
    info = ctx.ml.read_model_info(inputs.base_dir)
    central = _calibrate_central_images(ctx, inputs, info)
    training = finetune_training_spec(inputs.spec, reservation=inputs.reservation,
                                      dataset=inputs.dataset, base=info,
                                      central=central[1] if central else None)
    ctx.ml.check_training(training, inputs.base_dir)
    _fetch_private_data(ctx, inputs)
    hooks = LeasedHooks(ctx, inputs.reservation.reservation_id, central=central)
    ctx.heartbeat.phase("training")
    try:
        result = _train(ctx, training, inputs, hooks)
    finally:
        _upload_private_stats(ctx, hooks)
    unfinished = unfinished_training(ctx, hooks, stopped_early=result.stopped_early,
                                     steps=result.steps_completed)
    if unfinished is not None:
        return unfinished
    return _succeed(ctx, inputs, result, central=central[1] if central else None,
                    charged=hooks.releases)


def _train(ctx: JobContext, training: TrainingSpec, inputs: _Inputs,
           hooks: LeasedHooks) -> TrainingResult:
    """Train in this process on the CPU, or on the worker's DEVICES when it is set so: rank 0
    is this process and uses these hooks, so leases, checkpoints and SIGTERM work as on the
    CPU."""
    out_dir = ctx.work_dir / "out"
    if ctx.ml.devices == "cpu":
        return ctx.ml.train(training, dataset_path=inputs.data_path, out_dir=out_dir,
                            hooks=hooks, base_model_dir=inputs.base_dir,
                            resume_from=inputs.resume_dir)
    return ctx.ml.train_placed(ctx.ml.devices, training, dataset_path=inputs.data_path,
                               out_dir=out_dir, hooks=hooks, base_model_dir=inputs.base_dir,
                               resume_from=inputs.resume_dir)


def _calibrate_central_images(ctx: JobContext, inputs: _Inputs, info: ModelInfo
                              ) -> tuple[CentralImagesRequest, CentralImagesRelease] | None:
    """The ledger's calibration (a dry run) of the job's central-image release, if any."""
    asked = inputs.spec.training.central_images
    if asked is None:
        return None
    rid = inputs.reservation.reservation_id
    return (release_request(ctx, asked, info, dry_run=False),
            calibrate(ctx, rid, asked, info))


def _fetch_inputs(ctx: JobContext) -> _Inputs:
    """The reservation, the base model, its DP ancestors and the checkpoint to resume."""
    claim = ctx.claim
    if claim.reservation_id is None or claim.dataset is None or claim.base_model is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a finetune claim needs a reservation, "
                           "a dataset and a base model")
    if claim.dataset.visibility != "private":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH, "a finetune needs a private dataset")
    spec = FinetuneSpec.model_validate(claim.spec)
    reservation = ctx.ledger.get_reservation(claim.reservation_id)
    ctx.heartbeat.phase("downloading")
    base_dir = download_folder(ctx, claim.base_model.object_key, "base")
    ancestors = _dp_ancestors(claim.base_model, claim.dataset, base_dir)
    resume_dir = (download_folder(ctx, claim.resume_checkpoint_key, "resume")
                  if claim.resume_checkpoint_key else None)
    return _Inputs(spec=spec, reservation=reservation, dataset=claim.dataset,
                   base=claim.base_model, base_dir=base_dir,
                   data_path=ctx.work_dir / "data.npz", resume_dir=resume_dir,
                   ancestors=ancestors)


def _fetch_private_data(ctx: JobContext, inputs: _Inputs) -> None:
    """Read grant (the reservation becomes "touched"), then the private dataset with it."""
    grant = ctx.ledger.read_grant(inputs.reservation.reservation_id, attempt=ctx.attempt,
                                  worker_id=ctx.worker_id)
    fetch_dataset(ctx, inputs.dataset, inputs.data_path, grant=grant.token)  # + selection


def _dp_ancestors(base: ModelRef, dataset: DatasetInfo, base_dir: Path) -> list[str]:
    """Reservations of the base model's DP training on the same budget (they compose): the
    same dataset, or one derived from or linked to it (they share records)."""
    budget = dataset.budget_id or dataset.dataset_id
    if not base.dp or (base.budget_id or base.dataset_id) != budget:
        return []
    provenance = read_provenance(base_dir)
    if provenance.get("dataset_id") != base.dataset_id or not provenance.get("reservation_ids"):
        raise DpsynthError(ErrorCode.INVALID_MODEL, "the base model's DP provenance is missing")
    return [str(r) for r in provenance["reservation_ids"]]


def _upload_private_stats(ctx: JobContext, hooks: LeasedHooks) -> None:
    """Upload the owner-only, non-DP statistics once (never logged or exported)."""
    if not hooks.private_stats or ctx.flags.stale.is_set():
        return
    body = {"job_id": ctx.job_id, "attempt": ctx.attempt, "non_dp": True, "owner_only": True,
            "note": "computed on private data outside any DP mechanism; owner-only",
            "steps": hooks.private_stats}
    path = ctx.work_dir / "private-stats.json"
    path.write_text(json.dumps(body))
    try:
        upload_and_register(ctx, key=private_stats_key(ctx.job_id, ctx.attempt), path=path,
                            kind="private_stats", metadata={"attempt": ctx.attempt},
                            content_type="application/json", owner_only=True, non_dp=True)
    except DpsynthError as exc:  # never mask the attempt's own outcome
        log.warning("owner-only statistics upload failed", extra={"code": str(exc.code)})


def per_label_record(inputs: _Inputs, result: TrainingResult,
                     eps: JobEpsilon) -> dict[str, dict[str, float | None]]:
    """Each class model's run for the manifest: σ_c, q_c, batch, steps, its epsilon.

    ``job_epsilon`` of the bundle (the record's top level) is the max over classes; each
    class's own figure composes its class's granted steps with the DP ancestors.
    """
    assert inputs.reservation.per_label is not None
    done = dict(result.steps_by_partition)
    by_class = eps.per_label or {}
    return {name: {"noise_multiplier": part.event.noise_multiplier,
                   "sample_rate": part.event.sample_rate,
                   "expected_batch_size": part.expected_batch_size,
                   "class_size": part.class_size, "steps_planned": part.steps_planned,
                   "steps": done.get(name), "job_epsilon": by_class.get(name)}
            for name, part in sorted(inputs.reservation.per_label.items())}


def _steps_used(inputs: _Inputs, result: TrainingResult) -> StepsUsed:
    """The steps on the model's own path, per reservation (per label: per class).

    After a crash, steps replayed from the last checkpoint are charged to the dataset (all
    granted steps are) but only the replaying attempt's steps produced the model, so the
    model's ``job_epsilon`` composes these counts. Ancestors' counts come from the base
    model's provenance; where it has none, the ledger counts their granted steps.
    """
    used: StepsUsed = {}
    if inputs.ancestors:
        recorded = read_provenance(inputs.base_dir).get("steps_used") or {}
        used.update({r: recorded[r] for r in inputs.ancestors if r in recorded})
    rid = inputs.reservation.reservation_id
    if inputs.reservation.per_label is not None:
        used[rid] = {str(k): int(v) for k, v in result.steps_by_partition.items()}
    else:
        used[rid] = int(result.steps_completed)
    return used


def epsilon_labels(ancestors: list[str], spent: float) -> dict[str, str | float | None]:
    """What the model's ``job_epsilon`` is, and the guarantee beside it (issue 13, item 8).

    With DP ancestors on the same budget, ``job_epsilon`` is a PLD composition of runs each
    chosen after the previous one's output was seen: valid only had the sequence been fixed
    in advance (``LINEAGE_LABEL``). The guarantee is the RDP filter's ``dataset_epsilon_spent``
    once the model's last step was granted: it covers every charge of the budget, so also
    the jobs whose outputs informed the choice of this one (docs/privacy.md, "Figures that
    are not a guarantee").
    """
    return {"job_epsilon_label": LINEAGE_LABEL if ancestors else None,
            "dataset_epsilon_spent": spent}


def central_record(plan: CentralImagesRelease,
                   charged: list[CentralImagesRelease]) -> dict[str, object]:
    """The central-image release for the manifest: the mechanism as the ledger calibrated
    and charged it (public numbers only). ``release_ids`` are the releases charged by this
    attempt (a resumed attempt reuses the released images of its checkpoint and charges
    none); the model's ``job_epsilon`` composes every release charged under the job's
    reservation."""
    return {"event": plan.event.model_dump(mode="json"), "noise_std": plan.noise_std,
            "bound": plan.bound, "second_moments": plan.second_moments,
            "epsilon": plan.epsilon, "delta": plan.delta,
            "target_epsilon": plan.target_epsilon,
            "release_ids": [c.release_id for c in charged]}


def _succeed(ctx: JobContext, inputs: _Inputs, result: TrainingResult, *,
             central: CentralImagesRelease | None = None,
             charged: list[CentralImagesRelease] | None = None) -> Outcome:
    """Job epsilon from the ledger, publish the model, close the reservation, propose."""
    rid, dataset_id = inputs.reservation.reservation_id, inputs.dataset.dataset_id
    reservation_ids = [*inputs.ancestors, rid]
    steps_used = _steps_used(inputs, result)
    budget_id = inputs.dataset.budget_id or dataset_id
    # the filter figure once every step of the model is granted (issue 13, item 8)
    spent = ctx.ledger.budget_view(budget_id).dataset_epsilon_spent
    eps = ctx.ledger.job_epsilon(dataset_id=budget_id, reservation_ids=reservation_ids,
                                 steps_used=steps_used)
    event, plan = inputs.reservation.event, inputs.reservation.plan
    job_ids = [*(inputs.base.job_ids if inputs.ancestors else []), ctx.job_id]
    record: dict[str, object] = {
        "dp": True, "dataset_id": dataset_id, "reservation_ids": reservation_ids,
        "job_ids": job_ids, "job_epsilon": eps.job_epsilon, "delta": eps.delta,
        **epsilon_labels(inputs.ancestors, spent),
        "accountant": plan.accountant if plan else None,
        "admission_order": plan.admission_order if plan else None,
        "noise_multiplier": getattr(event, "noise_multiplier", None),
        "sample_rate": getattr(event, "sample_rate", None),
        "steps": result.steps_completed, "neighbouring": str(event.neighbouring),
        "expected_batch_size": inputs.reservation.expected_batch_size,
        "max_grad_norm": inputs.spec.privacy.max_grad_norm,
        "base_model_id": inputs.base.model_id, "steps_used": steps_used,
        "training": inputs.spec.training.model_dump(mode="json")}
    if inputs.reservation.per_label is not None:
        record["per_label"] = per_label_record(inputs, result, eps)
    if central is not None:
        record["central_images"] = central_record(central, charged or [])
    published = publish_model(ctx, result.model_dir, provenance=record, metadata={
        **record, "trainable_parameters": result.trainable_parameters,
        "total_parameters": result.total_parameters})
    close_reservation(ctx, "succeeded")
    propose(ctx, JobState.SUCCEEDED, result={
        "model_id": published.model_id, "artifact_id": published.artifact_id,
        "model_hash": published.model_hash, "job_epsilon": eps.job_epsilon, "delta": eps.delta,
        **epsilon_labels(inputs.ancestors, spent),
        "steps_used": steps_used, "trainable_parameters": result.trainable_parameters,
        # the device kind and ranks it ran on: its audits are keyed by them (jobs/audits.py
        # in the api)
        "device": str(result.device).split(":", 1)[0],
        "world_size": int(getattr(result, "world_size", 1))})
    log.info("finetune succeeded", extra={"steps": result.steps_completed})
    return Outcome.SUCCEEDED
