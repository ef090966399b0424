"""DP fine-tuning of a pretrained latent diffusion model (DP-LDMs, Liu et al., TMLR 2024).

Split in three: :mod:`~dpsynth_ml.training.finetune.setup` (model, data, trainable set, engine,
sampler), :mod:`~dpsynth_ml.training.finetune.loop` (the DP-SGD steps) and
:mod:`~dpsynth_ml.training.finetune.checkpoints` (save and resume); :func:`run_finetune` runs them.

The VAE is frozen and only encodes the private images; the UNet's attention modules (or the
whole UNet) and, when labels are new, the class embedder are trained with DP-SGD (Abadi et
al. 2016; diffusion-specific practice from DPDM, Dockhorn et al.). Only the DP-trained UNet
and embedder depend on private data, so the released model is DP by post-processing.

Each logical step Poisson-samples once over the whole dataset, pads the sample with masked
rows to a fixed number of rows computed from public quantities (``dp.padding``: every step
costs the same whatever the data; a rare larger sample is processed whole, in extra padded
chunks, never truncated), splits it into physical micro-batches of
``max_physical_batch_size``, draws
label dropout once per sampled example, lets each example's loss average ``K =
noise_multiplicity`` (timestep, noise) draws before its one gradient is clipped, adds the
noise once and divides by ``expected_batch_size`` (``DpSgdEngine``). The optimiser's rate
follows a linear warm-up over logical steps; with ``ema_decay`` an EMA of the trained
weights (diffusers ``EMAModel``) is what the model and checkpoints release, while
checkpoints also keep the raw weights to resume from (post-processing of DP outputs, free).

With ``SubjectLevel`` privacy the step is user-level DP-SGD (``loop._subject_batches``):
Poisson sampling over subjects, up to ``max_images_per_subject`` images of each sampled
subject chosen uniformly, their per-example gradients averaged into ONE contribution per
subject, clipped once; the noised sum is divided by the expected number of subjects.

With ``central_images`` (DP-FETA), ``setup.prepare`` first releases noisy class means
(charged through ``hooks.charge_release`` before any noise is drawn) and warms the whole
denoiser up on them, before the DP optimizer, engine and EMA are built
(:mod:`dpsynth_ml.warmup`); the release travels with every checkpoint and the model
(``central_images.npz``, plus ``central_images.png`` in the model), and a resume reuses it
without charging or warming up again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from dpsynth_ml.data import ImageDataset
from dpsynth_ml.models.model_io import save_model
from dpsynth_ml.parallel.distributed import Placement, RankHooks, broadcast_flag
from dpsynth_ml.spec import FinetuneTraining, RngKind, TrainingResult
from dpsynth_ml.training.checkpoint import write_trainer_state
from dpsynth_ml.training.finetune import checkpoints, loop, setup
from dpsynth_ml.training.finetune.setup import ModelAndData, model_and_data, whole_dataset_privacy
from dpsynth_ml.training.hooks import TrainingHooks


def run_finetune(spec: FinetuneTraining, *, dataset_path: Path, out_dir: Path, hooks: TrainingHooks,
                 base_model_dir: Path | None, resume_from: Path | None,
                 generator: torch.Generator, rng: RngKind,
                 dataset: ImageDataset | None = None,
                 placement: Placement | None = None) -> TrainingResult:
    """Run (or resume) a DP finetune; see :func:`dpsynth_ml.train` for the contract.

    ``dataset``, when given, is used instead of loading ``dataset_path`` (per-label training
    passes one class's records). ``placement`` puts the trained model on a device and, with
    a world size W > 1, makes this process one rank of a W-rank job (docs/multi-gpu.md):
    every rank calls this with its own generator; only rank 0 talks to ``hooks`` and writes
    checkpoints and the model.
    """
    placement = placement if placement is not None else Placement()
    if placement.distributed:
        hooks = RankHooks(hooks, placement)
    run = setup.prepare(spec, dataset_path=dataset_path, out_dir=out_dir,
                        base_model_dir=base_model_dir, resume_from=resume_from,
                        generator=generator, rng=rng, dataset=dataset, placement=placement,
                        hooks=hooks)
    checkpoints.attach_schedule_and_ema(run, resume_from)
    step, stopped = loop.train_loop(run, hooks)
    run.engine.close()
    last = out_dir / "checkpoints" / checkpoints.checkpoint_name(step)
    # rank 0's disk decides, for every rank (checkpoints.checkpoint is collective on W ranks)
    if broadcast_flag(placement, step > run.start_step and not last.exists()):
        checkpoints.checkpoint(run, step, hooks)
    model_dir = out_dir / "model"
    if placement.is_main:
        with checkpoints.released_weights(run):
            model_dir = save_model(run.bundle, checkpoints.stamp(run, step), model_dir)
        checkpoints.copy_central_images(run, model_dir, preview=True)
        write_trainer_state(out_dir, checkpoints.trainer_state(run, step))
    trainable = sum(p.numel() for p in run.engine.params)
    return TrainingResult(steps_completed=step, stopped_early=stopped, model_dir=model_dir,
                          trainable_parameters=trainable,
                          total_parameters=run.bundle.parameter_count(), rng=run.rng)


__all__: Sequence[str] = ["ModelAndData", "model_and_data", "run_finetune",
                          "whole_dataset_privacy"]
