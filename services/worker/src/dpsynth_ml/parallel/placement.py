"""Where a training job runs, from the worker's ``DEVICES`` setting.

``auto`` (the worker's default) is every GPU the process can see, or the CPU when it sees
none, so one worker image serves a GPU node and a laptop. A list of W devices makes one job
run on W ranks (docs/multi-gpu.md). A whole-dataset DP finetune runs on every listed device
(one rank each); a pretrain and a per-label finetune run on the FIRST device of the setting
only (one process; a log line says so when more were listed). Every result records the
device it ran on (``TrainingResult.device``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from dpsynth_ml.parallel.distributed import Placement, parse_devices
from dpsynth_ml.parallel.ranks import train_on_ranks
from dpsynth_ml.spec import (
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    PretrainTraining,
    RngKind,
    TrainingResult,
    TrainingSpec,
)
from dpsynth_ml.training.entry import os_seeded_generator, placeable, train
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks
from dpsynth_ml.training.per_label import run_per_label
from dpsynth_ml.training.pretrain import run_pretrain

log = logging.getLogger(__name__)


def resolve_devices(setting: str) -> list[torch.device]:
    """The devices of a ``DEVICES`` setting: ``auto``, ``cpu``, ``cuda``, ``cuda:all`` or a
    comma-separated list such as ``cuda:0,cuda:1`` (see
    :func:`dpsynth_ml.parallel.distributed.parse_devices`)."""
    text = setting.strip().lower()
    if text == "auto":
        text = "cuda:all" if torch.cuda.is_available() and torch.cuda.device_count() else "cpu"
    return parse_devices(text)


def first_device(setting: str) -> torch.device:
    """The first device of a ``DEVICES`` setting (where single-device phases run)."""
    return resolve_devices(setting)[0]


def train_placed(setting: str, spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
                 hooks: TrainingHooks = NullHooks(), base_model_dir: Path | None = None,
                 resume_from: Path | None = None) -> TrainingResult:
    """:func:`dpsynth_ml.train` on the devices of ``setting``: a whole-dataset DP finetune
    on one rank per device; a pretrain or a per-label finetune on the first device."""
    devices = resolve_devices(setting)
    if not placeable(spec):
        if len(devices) > 1:
            where = "the CPU" if devices[0].type == "cpu" else str(devices[0])
            log.info(f"this training runs on {where} (the first device of the setting): "
                     "pretraining and per-label finetunes are not split across ranks",
                     extra={"devices": [str(d) for d in devices], "kind": spec.kind})
        if devices[0].type == "cpu":
            return train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                         base_model_dir=base_model_dir, resume_from=resume_from)
        return train_on_device(devices[0], spec, dataset_path=dataset_path, out_dir=out_dir,
                               hooks=hooks, base_model_dir=base_model_dir,
                               resume_from=resume_from)
    if devices == [torch.device("cpu")]:
        return train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                     base_model_dir=base_model_dir, resume_from=resume_from)
    log.info("training placed", extra={"devices": [str(d) for d in devices],
                                       "world_size": len(devices)})
    result = train_on_ranks(devices, spec, dataset_path=dataset_path, out_dir=out_dir,
                            hooks=hooks, base_model_dir=base_model_dir, resume_from=resume_from)
    return _stamped(result, devices[0])


def train_on_device(device: torch.device | str, spec: TrainingSpec, *, dataset_path: Path,
                    out_dir: Path, hooks: TrainingHooks = NullHooks(),
                    base_model_dir: Path | None = None, resume_from: Path | None = None,
                    _test_generator: torch.Generator | None = None) -> TrainingResult:
    """:func:`dpsynth_ml.train` in this process with every tensor on ``device``.

    Any spec: a pretrain (models, images and latents on the device; bf16 autocast on CUDA,
    :mod:`dpsynth_ml.training.pretrain`), a per-label finetune (every class's run placed on
    the device) or a whole-dataset finetune (rank 0 of 1 on the device). The arguments and
    errors are :func:`dpsynth_ml.train`'s.
    """
    device = torch.device(device)
    rng: RngKind = "test" if _test_generator is not None else "os"
    out_dir = Path(out_dir)
    if isinstance(spec, PretrainTraining):
        if resume_from is not None or base_model_dir is not None:
            raise InvalidSpecError("a pretrain starts from scratch (no base model, no resume)")
        out_dir.mkdir(parents=True, exist_ok=True)
        return run_pretrain(spec, dataset_path=Path(dataset_path), out_dir=out_dir,
                            hooks=hooks, rng=rng, device=device)
    if isinstance(spec, FinetuneTraining) and isinstance(spec.privacy, PerLabel):
        out_dir.mkdir(parents=True, exist_ok=True)
        generator = _test_generator if _test_generator is not None else os_seeded_generator()
        return run_per_label(spec, dataset_path=Path(dataset_path), out_dir=out_dir,
                             hooks=hooks, base_model_dir=base_model_dir,
                             resume_from=resume_from, generator=generator, rng=rng,
                             placement=Placement(device=device))
    result = train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                   base_model_dir=base_model_dir, resume_from=resume_from,
                   placement=Placement(device=device), _test_generator=_test_generator)
    return _stamped(result, device)


def _stamped(result: TrainingResult, device: torch.device) -> TrainingResult:
    """``result`` with the device it ran on recorded (rank 0's)."""
    if not isinstance(result, TrainingResult):  # a test's stand-in for the training
        return result
    return dataclasses.replace(result, device=str(device))
