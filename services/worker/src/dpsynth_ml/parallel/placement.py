"""Where a training job runs, from the worker's ``DEVICES`` setting.

``auto`` (the worker's default) is every GPU the process can see, or the CPU when it sees
none, so one worker image serves a GPU node and a laptop. A list of W devices makes one job
run on W ranks (docs/multi-gpu.md). Only a whole-dataset DP finetune is placed so far; other
training (pretraining, per-label finetunes) runs on the CPU as before, with a log line saying
so, rather than failing on a GPU worker.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dpsynth_ml.parallel.distributed import parse_devices
from dpsynth_ml.parallel.ranks import train_on_ranks
from dpsynth_ml.spec import TrainingResult, TrainingSpec
from dpsynth_ml.training.entry import placeable, train
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks

log = logging.getLogger(__name__)


def resolve_devices(setting: str) -> list[torch.device]:
    """The devices of a ``DEVICES`` setting: ``auto``, ``cpu``, ``cuda``, ``cuda:all`` or a
    comma-separated list such as ``cuda:0,cuda:1`` (see
    :func:`dpsynth_ml.parallel.distributed.parse_devices`)."""
    text = setting.strip().lower()
    if text == "auto":
        text = "cuda:all" if torch.cuda.is_available() and torch.cuda.device_count() else "cpu"
    return parse_devices(text)


def train_placed(setting: str, spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
                 hooks: TrainingHooks = NullHooks(), base_model_dir: Path | None = None,
                 resume_from: Path | None = None) -> TrainingResult:
    """:func:`dpsynth_ml.train` on the devices of ``setting`` (one rank per device)."""
    devices = resolve_devices(setting)
    if devices == [torch.device("cpu")] or not placeable(spec):
        if devices != [torch.device("cpu")]:
            log.info("this training runs on the CPU: only whole-dataset DP finetunes are "
                     "placed on other devices so far",
                     extra={"devices": [str(d) for d in devices], "kind": spec.kind})
        return train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                     base_model_dir=base_model_dir, resume_from=resume_from)
    log.info("training placed", extra={"devices": [str(d) for d in devices],
                                       "world_size": len(devices)})
    return train_on_ranks(devices, spec, dataset_path=dataset_path, out_dir=out_dir,
                          hooks=hooks, base_model_dir=base_model_dir, resume_from=resume_from)
