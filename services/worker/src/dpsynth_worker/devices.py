"""Where a worker's single-device ML calls run: the first device of DPSYNTH_WORKER_DEVICES.

A whole-dataset DP finetune runs on every listed device (one rank each, through
``MlPort.train_placed``); every other phase (pretraining, per-label finetunes, generation,
feature networks, evaluation) runs on the FIRST listed device. :func:`first_device` turns the
setting into that device's torch string ("cpu", "cuda:0", "cuda:1", ...). Importing this
module imports nothing heavy: torch is imported only to resolve ``auto``, on the call, the
way :class:`dpsynth_worker.ml_adapter.MlAdapter` imports the ML core.
"""

from __future__ import annotations


def first_device(setting: str) -> str:
    """The torch device string of the setting's first device.

    ``auto`` is ``cuda:0`` when this process sees a GPU, else ``cpu``; ``cuda`` and
    ``cuda:all`` are ``cuda:0``; a list (``cuda:1,cuda:2``) gives its first entry. The
    setting is validated where devices are used (``dpsynth_ml.train_placed``), not here.
    """
    entries = [e.strip().lower() for e in setting.split(",") if e.strip()]
    first = entries[0] if entries else "cpu"
    if first == "auto":
        import torch  # only now: a worker starts without torch

        return "cuda:0" if torch.cuda.is_available() and torch.cuda.device_count() else "cpu"
    if first in ("cuda", "cuda:all"):
        return "cuda:0"
    return first


__all__ = ["first_device"]
