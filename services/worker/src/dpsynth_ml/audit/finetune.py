"""A white-box audit of a finetune's DP-SGD, run through the finetune's own code.

:func:`audit_finetune` builds the run exactly as :func:`dpsynth_ml.train` would
(``training.finetune.setup.prepare``: the base model, the trainable set, the engine the
finetune would choose, the sampler, the fixed padded rows, noise multiplicity, label
dropout, micro-batches, the LR warm-up and EMA), on a PUBLIC stand-in dataset that the
caller sized like the private one (N̂, image size, channels, classes). Every logical step
is the finetune's own first half (``loop.accumulate_step``: the stand-in records' Poisson
batch, clipped into the sum); then the gradient canaries of :mod:`dpsynth_ml.audit.whitebox`
join the same sum through the engine's clipping, the engine noises it once, the auditor
reads it, and the finetune's own second half applies it. The canaries are extra units,
each sampled at the run's q, like records padding the stand-in up to N̂.

The model trained here is never saved or returned (issue 19, item 4): the work folder is a
temporary one, deleted on return, and the only output is the bound and its counts.

A per-label finetune is audited one class's run at a time (``audited_class``): exactly the
run the per-label trainer makes for that class (``training.per_label.class_run``: that
class's DpSpec, unconditional, on the stand-in's records of that class).

The run is placed on ``device`` (one rank: the model, the encoded stand-in, the per-example
gradients, the canaries' sums and the noise live there, as in a finetune placed on that
device by ``train_on_device``), so a finetune that ran on a GPU is audited on a GPU. A
finetune that ran on W ranks is audited on W ranks (``placement``, started by
:func:`dpsynth_ml.audit.ranks.audit_on_ranks`): each rank samples its shard of the stand-in,
the ranks' sums are all-reduced and rank 0 draws the one noise, exactly the finetune's
distributed mechanism (``dpsynth_ml.dp.distributed``); the canaries are rank 0's units.

Not audited here: the central-image release (a separate Gaussian mechanism, refused:
``central_images`` must be off).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from dpsynth_ml.audit.whitebox import (
    DEFAULT_CANARY_NORM,
    DiracCanaries,
    WhiteBoxAudit,
    white_box_audit,
)
from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.parallel.distributed import Placement
from dpsynth_ml.spec import FinetuneTraining, InvalidSpecError, PerLabel
from dpsynth_ml.training.finetune import checkpoints, loop, setup
from dpsynth_ml.training.hooks import NullHooks
from dpsynth_ml.training.per_label import class_run


def audit_finetune(spec: FinetuneTraining, *, dataset_path: Path, base_model_dir: Path,
                   canaries: int, delta: float, generator: torch.Generator,
                   confidence: float = 0.95, canary_norm: float = DEFAULT_CANARY_NORM,
                   claimed_mu: float | None = None, tail_delta: float = 0.0,
                   seeded_noise: bool = False,
                   audited_class: str | None = None,
                   device: torch.device | str = "cpu",
                   placement: Placement | None = None) -> WhiteBoxAudit:
    """White-box one-run audit of ``spec``'s DP-SGD on the stand-in at ``dataset_path``.

    Args:
        spec: the finetune's training spec, with the ledger's sigma, q and steps.
        dataset_path: the PUBLIC stand-in (never a private dataset: nothing here is charged).
        base_model_dir: the finetune's base model.
        canaries: m, at most the number of trainable values.
        delta: the delta of the claims tested (the dataset's).
        generator: the stand-in's and the canaries' sampling, label dropout and diffusion
            draws.
        confidence: of the bound.
        canary_norm: each canary gradient's norm in units of C.
        claimed_mu, tail_delta: the ledger's GDP envelope of the spec's sigma, q and steps
            (``dp_sgd_gdp_envelope``): the result then says whether the run rejects it.
        seeded_noise: TESTS ONLY: key the DP noise from ``generator`` (replayable) instead
            of 256 fresh bits of OS entropy.
        audited_class: a per-label finetune: the class whose run is audited (required
            then, refused otherwise).
        device: where the run is placed (one rank); the bound's computation is on the CPU.
        placement: this process's rank of a W-rank audit (``dpsynth_ml.audit.ranks``,
            which starts the process group; it overrides ``device``). Every rank calls this
            with its own ``generator`` (its shard's Poisson sampling); rank 0 alone adds the
            canaries and its result is the audit's; the others' results mean nothing.

    Raises:
        InvalidSpecError: for what this audit does not cover (central images), a per-label
            spec without ``audited_class`` or a whole-dataset one with it.
    """
    if spec.central_images is not None:
        raise InvalidSpecError("the audit covers DP-SGD only: audit the spec without "
                               "central_images (the release is its own Gaussian mechanism)")
    dataset: ImageDataset | None = None
    if isinstance(spec.privacy, PerLabel):
        if audited_class is None:
            raise InvalidSpecError("a per-label finetune is audited one class's run at a "
                                   "time: name audited_class")
        spec, dataset = class_run(spec, load_dataset(dataset_path), audited_class)
    elif audited_class is not None:
        raise InvalidSpecError("audited_class is for per-label finetunes")
    with tempfile.TemporaryDirectory(prefix="dpsynth-audit-") as work:
        run = setup.prepare(spec, dataset_path=dataset_path, out_dir=Path(work),
                            base_model_dir=base_model_dir, resume_from=None,
                            generator=generator, rng="test" if seeded_noise else "os",
                            dataset=dataset, hooks=NullHooks(),
                            placement=placement or Placement(device=torch.device(device)))
        try:
            checkpoints.attach_schedule_and_ema(run, None)
            values = sum(p.numel() for p in run.engine.params)
            drawn = DiracCanaries.draw(values, canaries, generator, norm=canary_norm)
            return white_box_audit(
                run.engine, drawn, steps=run.dp.steps, sample_rate=run.dp.sample_rate,
                expected_batch_size=run.dp.expected_batch_size, generator=generator,
                delta=delta, confidence=confidence, claimed_mu=claimed_mu,
                tail_delta=tail_delta, records_step=lambda: _accumulate(run),
                finish_step=lambda: loop.apply_private_gradient(run),
                inject=run.placement.is_main)
        finally:
            run.engine.close()


def _accumulate(run: setup.FinetuneRun) -> None:
    loop.accumulate_step(run)
