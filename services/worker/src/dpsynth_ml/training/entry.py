"""The ``train`` entry point: picks the randomness source and dispatches by kind."""

from __future__ import annotations

import secrets
from pathlib import Path

import torch

from dpsynth_ml.parallel.distributed import Placement
from dpsynth_ml.spec import (
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    PretrainTraining,
    RngKind,
    TrainingResult,
    TrainingSpec,
)
from dpsynth_ml.training.finetune import run_finetune
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks
from dpsynth_ml.training.per_label import run_per_label
from dpsynth_ml.training.pretrain import run_pretrain


def os_seeded_generator() -> torch.Generator:
    """A fresh CPU generator seeded from OS entropy (``secrets``), never from a spec.

    DP noise and Poisson sampling must be unpredictable and never replayed (docs/privacy.md), so
    each call to :func:`train` gets its own generator.
    """
    return torch.Generator().manual_seed(secrets.randbits(63))


def train(spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
          hooks: TrainingHooks = NullHooks(), base_model_dir: Path | None = None,
          resume_from: Path | None = None, placement: Placement | None = None,
          _test_generator: torch.Generator | None = None) -> TrainingResult:
    """Pretrain (public data) or DP-finetune (private data) a latent diffusion model.

    Args:
        spec: what to train: a :class:`PretrainTraining` (public data, no DP) or a
            :class:`FinetuneTraining`, whose privacy is whole-dataset DP-SGD over images
            (``RecordLevel``) or subjects (``SubjectLevel``), or one model per class
            (``PerLabel``, see :mod:`dpsynth_ml.training.per_label`). No spec trains without DP.
        dataset_path: canonical ``.npz`` dataset (see :func:`dpsynth_ml.load_dataset`).
        out_dir: the model is written to ``out_dir/model``; a finetune also writes
            ``out_dir/checkpoints/step-NNNNNNN/`` and ``out_dir/trainer_state.json``.
        hooks: step leases, cancellation, progress, checkpoints and private statistics.
        base_model_dir: the pretrained model a finetune starts from (a per-label finetune
            needs it on resume too: the classes not started yet start from it).
        resume_from: a finetune checkpoint directory to continue from: model, optimizer,
            EMA, LR schedule and steps done are restored; randomness is fresh.
        placement: rank, world size and device (default: one process on the CPU), for a
            whole-dataset DP finetune: on W > 1 ranks every rank calls ``train`` (see
            docs/multi-gpu.md) and only rank 0 uses ``hooks`` and writes. Pretrains and
            per-label finetunes run on ONE device through
            :func:`dpsynth_ml.parallel.placement.train_on_device` instead.
        _test_generator: tests only. Replaces the OS-seeded generator for Poisson sampling,
            DP noise and diffusion draws; the output is stamped ``rng: "test"``.

    Returns:
        Steps completed, whether it stopped early, the model dir and parameter counts.

    Raises:
        InvalidSpecError: if spec, dataset or base model do not fit together.
    """
    rng: RngKind = "test" if _test_generator is not None else "os"
    if placement is not None and placement != Placement() and not placeable(spec):
        raise InvalidSpecError("only a whole-dataset DP finetune runs on another device or "
                               "on several ranks so far")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(spec, PretrainTraining):
        if resume_from is not None or base_model_dir is not None:
            raise InvalidSpecError("a pretrain starts from scratch (no base model, no resume)")
        return run_pretrain(spec, dataset_path=Path(dataset_path), out_dir=out_dir,
                            hooks=hooks, rng=rng)
    if not isinstance(spec, FinetuneTraining):
        raise InvalidSpecError(f"not a training spec: {type(spec).__name__}")
    generator = _test_generator if _test_generator is not None else os_seeded_generator()
    if isinstance(spec.privacy, PerLabel):
        return run_per_label(spec, dataset_path=Path(dataset_path), out_dir=out_dir,
                             hooks=hooks, base_model_dir=base_model_dir,
                             resume_from=resume_from, generator=generator, rng=rng)
    return run_finetune(spec, dataset_path=Path(dataset_path), out_dir=out_dir, hooks=hooks,
                        base_model_dir=base_model_dir, resume_from=resume_from,
                        generator=generator, rng=rng, placement=placement)


def placeable(spec: TrainingSpec) -> bool:
    """Whether ``spec`` runs through ``train``'s ``placement`` (several ranks): a
    whole-dataset DP finetune. Pretrains and per-label finetunes are placed on one device by
    :func:`dpsynth_ml.parallel.placement.train_on_device`."""
    return isinstance(spec, FinetuneTraining) and not isinstance(spec.privacy, PerLabel)


def check_training(spec: TrainingSpec, base_model_dir: Path) -> None:
    """Check a finetune spec against its base model without touching any data.

    The worker calls this before it asks for a read grant, so a spec that cannot run (an
    unknown block prefix, a mode that selects nothing) fails before private data is read.

    Raises:
        InvalidSpecError: with the reason (for blocks, the valid prefixes).
    """
    from dpsynth_ml.models.model_io import load_model
    from dpsynth_ml.models.trainable import trainable_parameter_names, trains_embedder

    if not isinstance(spec, FinetuneTraining):
        return
    bundle, info = load_model(Path(base_model_dir))
    if spec.target == "masks" and info.extra.get("layout_channels"):
        raise InvalidSpecError("a layout generator (target 'masks') cannot start from a "
                               "layout-conditioned base model")
    trainable_parameter_names(bundle.unet, trainable=spec.trainable, blocks=spec.blocks,
                              train_embedder=trains_embedder(spec))
