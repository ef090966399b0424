"""A real tiny model folder (diffusers format, safetensors) for tests that need one to exist
without running a pretrain job: pretrained for one quick epoch by the ML core itself."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np


def tiny_model_dir(workdir: Path, *, class_names: list[str], image_size: int = 16) -> Path:
    from dpsynth_ml import PretrainTraining, train

    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = 8 * len(class_names)
    npz = workdir / "data.npz"
    np.savez(npz, images=rng.integers(0, 255, (n, image_size, image_size, 1), dtype=np.uint8),
             labels=np.arange(n) % len(class_names), class_names=np.array(class_names))
    spec = PretrainTraining(preset="tiny", image_size=image_size, channels=1,
                            num_classes=len(class_names), epochs=1, batch_size=32)
    return train(spec, dataset_path=npz, out_dir=workdir / "out").model_dir


def tiny_model_archive(dest: Path, *, class_names: list[str], image_size: int = 16) -> Path:
    model_dir = tiny_model_dir(dest.parent / "tiny-model", class_names=class_names,
                               image_size=image_size)
    with tarfile.open(dest, "w") as tar:
        for path in sorted(model_dir.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(model_dir)))
    return dest
