"""Pretraining on a public dataset (non-private; DESIGN §1 workflow step A)."""

from __future__ import annotations

import logging

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import PretrainSpec
from dpsynth_shared.job_states import JobState

from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.hooks import PlainHooks
from dpsynth_worker.runners.outcome import Outcome, propose, stopped
from dpsynth_worker.runners.publish import publish_model
from dpsynth_worker.runners.selection import fetch_dataset
from dpsynth_worker.runners.training_specs import pretrain_training_spec

log = logging.getLogger(__name__)


def run_pretrain(ctx: JobContext) -> Outcome:
    """Download the public dataset, train, publish the model, propose ``succeeded``."""
    spec = PretrainSpec.model_validate(ctx.claim.spec)
    if spec.initialise_only:
        return _initialise_only(ctx, spec)
    dataset = ctx.claim.dataset
    if dataset is None or dataset.visibility != "public":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH, "a pretrain needs a public dataset")
    ctx.heartbeat.phase("downloading dataset")
    data_path = ctx.work_dir / "data.npz"
    fetch_dataset(ctx, dataset, data_path)  # public data, with a derived dataset's selection
    training = pretrain_training_spec(spec, dataset)
    ctx.heartbeat.phase("training")
    # on the first device of DPSYNTH_WORKER_DEVICES (bf16 autocast on CUDA; public data)
    if ctx.ml.devices == "cpu":
        result = ctx.ml.train(training, dataset_path=data_path, out_dir=ctx.work_dir / "out",
                              hooks=PlainHooks(ctx))
    else:
        result = ctx.ml.train_placed(ctx.ml.devices, training, dataset_path=data_path,
                                     out_dir=ctx.work_dir / "out", hooks=PlainHooks(ctx))
    if result.stopped_early:
        return stopped(ctx)
    published = publish_model(
        ctx, result.model_dir,
        provenance={"dp": False, "job_ids": [ctx.job_id], "public_dataset_id": dataset.dataset_id},
        metadata={"dp": False, "trainable_parameters": result.trainable_parameters,
                  "total_parameters": result.total_parameters,
                  "steps": result.steps_completed, "public_dataset_id": dataset.dataset_id,
                  "preset": spec.preset, "space": spec.space,
                  "layout_conditioning": spec.layout_conditioning,
                  "target": spec.target})
    propose(ctx, JobState.SUCCEEDED, result={"model_id": published.model_id,
                                              "artifact_id": published.artifact_id,
                                              "model_hash": published.model_hash})
    log.info("pretrain succeeded", extra={"steps": result.steps_completed,
                                          "device": result.device})
    return Outcome.SUCCEEDED


def _initialise_only(ctx: JobContext, spec: PretrainSpec) -> Outcome:
    """Write and publish a seeded, untrained pixel-space model (no data is read): the base
    of a finetune with no public data, warmed up on DP central images."""
    training = pretrain_training_spec(spec, None)
    ctx.heartbeat.phase("initialising")
    model_dir = ctx.ml.initial_model(training, spec.class_names or [], ctx.work_dir / "out")
    published = publish_model(
        ctx, model_dir,
        provenance={"dp": False, "job_ids": [ctx.job_id], "public_dataset_id": None,
                    "initialised_only": True},
        metadata={"dp": False, "steps": 0, "public_dataset_id": None,
                  "initialised_only": True, "preset": spec.preset, "space": spec.space,
                  "layout_conditioning": False, "target": "images"})
    propose(ctx, JobState.SUCCEEDED, result={"model_id": published.model_id,
                                              "artifact_id": published.artifact_id,
                                              "model_hash": published.model_hash})
    log.info("initial model written", extra={"classes": len(spec.class_names or [])})
    return Outcome.SUCCEEDED
