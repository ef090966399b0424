"""Where the worker's DEVICES setting puts a training job (dpsynth_ml.parallel.placement)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from dpsynth_ml.parallel import placement
from dpsynth_ml.spec import DpSpec, FinetuneTraining, PerLabel, PretrainTraining, RecordLevel

DP = DpSpec(noise_multiplier=1.0, sample_rate=0.1, expected_batch_size=8, max_grad_norm=1.0,
            steps=2)


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(placement, "train",
                        lambda spec, **kw: calls.append(("train", None)) or "one")
    monkeypatch.setattr(placement, "train_on_ranks",
                        lambda devices, spec, **kw: calls.append(("ranks", devices)) or "many")
    return calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only resolution")
def test_auto_is_the_cpu_without_a_gpu() -> None:
    assert placement.resolve_devices("auto") == [torch.device("cpu")]
    assert placement.resolve_devices(" AUTO ") == [torch.device("cpu")]
    with pytest.raises(ValueError, match="not a visible GPU"):
        placement.resolve_devices("cuda:0")


def test_a_dp_finetune_on_several_devices_runs_on_ranks(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    calls = _calls(monkeypatch)
    spec = FinetuneTraining(privacy=RecordLevel(DP))
    assert placement.train_placed("cpu,cpu", spec, dataset_path=tmp_path,
                                  out_dir=tmp_path) == "many"
    assert calls == [("ranks", [torch.device("cpu"), torch.device("cpu")])]
    assert placement.train_placed("cpu", spec, dataset_path=tmp_path, out_dir=tmp_path) == "one"


def test_other_training_stays_on_the_cpu_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    calls = _calls(monkeypatch)
    per_label = FinetuneTraining(privacy=PerLabel({"0": RecordLevel(DP), "1": RecordLevel(DP)}))
    specs = [PretrainTraining(), per_label]
    with caplog.at_level(logging.INFO, logger="dpsynth_ml.parallel.placement"):
        for spec in specs:
            assert not placement.placeable(spec)
            assert placement.train_placed("cpu,cpu", spec, dataset_path=tmp_path,
                                          out_dir=tmp_path) == "one"
    assert calls == [("train", None)] * 2
    assert sum("runs on the CPU" in r.getMessage() for r in caplog.records) == 2
