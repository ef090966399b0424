"""The `small` preset accepts the issue's pretrain spec shape (32x32, 1 channel) and trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dpsynth_ml import PretrainTraining, read_model_info, train


def test_small_preset_pretrains_at_32x32(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    npz = tmp_path / "public.npz"
    np.savez(npz, images=rng.integers(0, 255, (16, 32, 32, 1), dtype=np.uint8),
             labels=np.arange(16) % 4, class_names=np.array(["a", "b", "c", "d"]))
    spec = PretrainTraining(preset="small", image_size=32, channels=1,
                        num_classes=4, epochs=1, batch_size=16)
    result = train(spec, dataset_path=npz, out_dir=tmp_path / "out")
    info = read_model_info(result.model_dir)
    assert (info.preset, info.image_size, info.channels, info.num_classes) == ("small", 32, 1, 4)
    assert result.total_parameters == result.trainable_parameters > 0  # pretrain: all
