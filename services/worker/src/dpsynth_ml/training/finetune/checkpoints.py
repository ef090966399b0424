"""Checkpoints of a finetune: what is saved (model with the released weights, raw and EMA
weights, optimizer and trainer state) and how an attempt resumes from it (the step count
under the same DpSpec, the schedule and EMA restored exactly; randomness never)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from diffusers.training_utils import EMAModel

from dpsynth_ml.dp import SubjectPoissonSampler
from dpsynth_ml.dp.distributed import (
    DistributedBookKeepingEngine,
    DistributedDpSgdEngine,
    ShardedSubjectPoissonSampler,
)
from dpsynth_ml.models.model_io import save_model
from dpsynth_ml.spec import (
    DpSpec,
    InvalidSpecError,
    ModelInfo,
)
from dpsynth_ml.training.checkpoint import (
    EMA_FILE,
    TRAINABLE_FILE,
    load_named_tensors,
    read_trainer_state,
    restore_schedule,
    save_named_tensors,
    save_optimizer_state,
    schedule_state,
    warmup_schedule,
    write_trainer_state,
)
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.warmup.store import PREVIEW_FILE, RELEASE_FILE, write_preview

if TYPE_CHECKING:
    from dpsynth_ml.training.finetune.setup import FinetuneRun


def dp_record(dp: DpSpec) -> dict[str, float | int]:
    return {"noise_multiplier": dp.noise_multiplier, "sample_rate": dp.sample_rate,
            "expected_batch_size": dp.expected_batch_size,
            "max_grad_norm": dp.max_grad_norm, "steps": dp.steps}


def resume_step(resume_from: Path, dp: DpSpec) -> int:
    """Step to resume at; the checkpoint must come from a job with the same DpSpec."""
    state = read_trainer_state(resume_from)
    if state.get("kind") != "finetune" or state.get("dp") != dp_record(dp):
        raise InvalidSpecError("checkpoint was written under a different DP spec")
    return int(state["step"])


def trainer_state(run: FinetuneRun, step: int) -> dict[str, object]:
    """What the trainer actually used (read back by tests and by resume).

    ``step`` is the accountant's state: logical steps done over all attempts. No RNG state.
    """
    return {"kind": "finetune", "step": step, "dp": dp_record(run.dp),
            "fixed_batch": run.fixed.record() if run.fixed is not None else None,
            "sampler": {"sample_rate": run.sampler.sample_rate,
                        "sample_rate_hex": float(run.sampler.sample_rate).hex(),
                        "num_records": run.sampler.num_records,
                        "draws_this_attempt": run.sampler.draws,
                        **_unit_record(run)},
            "start_step": run.start_step, "trainable_parameter_names": run.trainable_names,
            "noise_multiplicity": run.spec.noise_multiplicity,
            "lr_schedule": (schedule_state(run.lr_schedule)
                            if run.lr_schedule is not None else None),
            "ema": ({"decay": run.ema.decay, "optimization_step": run.ema.optimization_step}
                    if run.ema is not None else None)}


def _unit_record(run: FinetuneRun) -> dict[str, object]:
    """What the sampler ranges over: images, or subjects with the per-subject image cap."""
    if isinstance(run.sampler, (SubjectPoissonSampler, ShardedSubjectPoissonSampler)):
        return {"unit": "subject", "max_images_per_subject":
                run.sampler.max_images_per_subject}
    return {"unit": "image"}


def attach_schedule_and_ema(run: FinetuneRun, resume_from: Path | None) -> None:
    """LR warm-up and EMA; on resume, restore raw weights, EMA and schedule exactly.

    The optimizer state is restored by ``setup.prepare``; the step count (the accountant's state)
    by ``resume_step``. Randomness is never restored.
    """
    params = run.engine.params
    state = read_trainer_state(resume_from) if resume_from is not None else {}
    if resume_from is not None and (Path(resume_from) / TRAINABLE_FILE).is_file():
        # The checkpoint's model holds the released (EMA) weights; training resumes from
        # the raw ones.
        raw = load_named_tensors(run.trainable_names, Path(resume_from) / TRAINABLE_FILE)
        with torch.no_grad():
            for p, value in zip(params, raw, strict=True):
                p.copy_(value.to(p.device, p.dtype))
    run.lr_schedule = warmup_schedule(run.engine.optimizer.original_optimizer,
                                      run.spec.warmup_steps)
    if state.get("lr_schedule"):
        restore_schedule(run.lr_schedule, state["lr_schedule"])
    elif run.start_step:  # an older checkpoint: the schedule is a function of the step
        sched, done = run.lr_schedule, run.start_step
        restore_schedule(sched, {"last_epoch": done, "_step_count": done + 1, "_last_lr": [
            base * fn(done) for base, fn in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]})
    if run.spec.ema_decay is None:
        return
    run.ema = EMAModel(params, decay=run.spec.ema_decay)
    saved = state.get("ema")
    if resume_from is not None and saved and (Path(resume_from) / EMA_FILE).is_file():
        shadow = load_named_tensors(run.trainable_names, Path(resume_from) / EMA_FILE)
        run.ema.shadow_params = [s.to(p.device, p.dtype) for s, p in zip(shadow, params,
                                                                         strict=True)]
        run.ema.optimization_step = int(saved["optimization_step"])


@contextmanager
def released_weights(run: FinetuneRun) -> Iterator[None]:
    """Inside the block the trainable parameters hold what is released (EMA if any)."""
    if run.ema is None:
        yield
        return
    params = run.engine.params
    run.ema.store(params)
    run.ema.copy_to(params)
    try:
        yield
    finally:
        run.ema.restore(params)


def stamp(run: FinetuneRun, step: int) -> ModelInfo:
    extra = run.info.extra
    if run.fixed is not None:  # the timing channel's public cost (docs/privacy.md)
        extra = {**extra, "fixed_batch": run.fixed.record()}
    if run.physical_batch and run.physical_batch != run.spec.max_physical_batch_size:
        extra = {**extra, "micro_batch_after_out_of_memory": run.physical_batch}
    return dataclasses.replace(run.info, steps=step, rng=run.rng, extra=extra)


#: the engines of one rank of a multi-rank job
_DISTRIBUTED = (DistributedDpSgdEngine, DistributedBookKeepingEngine)


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def checkpoint(run: FinetuneRun, step: int, hooks: TrainingHooks) -> None:
    """Write model dir + trainer state + optimizer state, then tell the platform."""
    if run.placement.distributed and not isinstance(run.engine, _DISTRIBUTED):
        raise RuntimeError("a multi-rank run needs the distributed engine")
    if isinstance(run.engine, _DISTRIBUTED) and not run.engine.parameters_in_sync():
        # collective (every rank checkpoints at the same steps); a diverged replica must
        # never be released
        raise RuntimeError("the ranks' model copies have diverged")
    if not run.placement.is_main:
        return
    ckpt = run.out_dir / "checkpoints" / checkpoint_name(step)
    with released_weights(run):
        # LoRA: the checkpoint keeps the unmerged base + adapters so a resume continues
        # exactly; the released model (run_finetune) merges them.
        save_model(run.bundle, stamp(run, step), ckpt, keep_adapters=True)
    write_trainer_state(ckpt, trainer_state(run, step))
    save_optimizer_state(run.engine.optimizer.original_optimizer, run.trainable_names, ckpt)
    save_named_tensors(run.engine.params, run.trainable_names, ckpt / TRAINABLE_FILE)
    if run.ema is not None:
        save_named_tensors(run.ema.shadow_params, run.trainable_names, ckpt / EMA_FILE)
    copy_central_images(run, ckpt)
    hooks.on_checkpoint(step, ckpt)


def copy_central_images(run: FinetuneRun, target_dir: Path, *, preview: bool = False) -> None:
    """Put the released central images (public) into a checkpoint or the model directory;
    with ``preview`` also their grid (one row per class). A no-op without central_images.

    A resume reads them back from the checkpoint and never releases (or charges) again.
    """
    if run.spec.central_images is None:
        return
    source = run.out_dir / RELEASE_FILE
    if not source.is_file():
        raise RuntimeError("the run's central_images.npz is missing")
    shutil.copyfile(source, Path(target_dir) / RELEASE_FILE)
    if preview:
        with np.load(source, allow_pickle=False) as npz:
            images = npz["images"]
        write_preview(Path(target_dir) / PREVIEW_FILE, images,
                      num_classes=len(images) // run.spec.central_images.queries)
