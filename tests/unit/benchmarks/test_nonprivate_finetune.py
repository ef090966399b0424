"""The non-private finetune (benchmarks only, outside the ML core): what it trains and what
it never uses. That the platform can never reach it is tested in
tests/unit/ml/test_worker_builds_dp_specs.py."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import dpsynth_ml
import pytest
import torch
from dpsynth_ml import InvalidSpecError, TrainingResult, read_model_info
from dpsynth_ml.models.model_io import load_model
from dpsynth_ml.models.trainable import lora_target_names, trainable_parameter_names
from dpsynth_ml.training.checkpoint import read_trainer_state
from dpsynth_ml.training.finetune import setup as ft_setup

from benchmarks.nonprivate_finetune import NonprivateFinetune, train_nonprivate
from tests.unit.ml.support import (
    IMAGE_SIZE,
    NUM_RECORDS,
    RecordingHooks,
    changed_parameters,
    model_state,
)

IDENTITY = {i: i for i in range(10)}


def nonprivate_spec(**overrides: Any) -> NonprivateFinetune:
    fields: dict[str, Any] = dict(image_size=IMAGE_SIZE, batch_size=32, epochs=1,
                                  max_physical_batch_size=8, learning_rate=1e-3,
                                  class_map=IDENTITY, checkpoint_every=10)
    fields.update(overrides)
    return NonprivateFinetune(**fields)


def _moves(names: set[str]) -> set[str]:
    """The names a noiseless update moves: the class token is the cross-attention's only
    key, so its softmax is 1 whatever Q and K are and attn2's to_q / to_k (and norm2, which
    feeds only the query) get a zero gradient up to rounding (DP-SGD's noise always moves
    them; a plain step may not)."""
    return {n for n in names if not any(f".{p}." in n for p in ("attn2.to_q", "attn2.to_k",
                                                                 "transformer_blocks.0.norm2"))}


@pytest.fixture()
def no_dp_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any use of the DP engine (per-sample gradients, clipping, noise) fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the non-private mode must not build the DP engine")

    monkeypatch.setattr(ft_setup, "DpSgdEngine", refuse)


# --- the spec ------------------------------------------------------------------------------

def test_the_nonprivate_spec_is_no_training_spec_of_the_core(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    """It has no privacy block, and the core's ``train`` refuses it."""
    spec = nonprivate_spec()
    assert not hasattr(spec, "privacy")
    with pytest.raises(InvalidSpecError, match="training spec"):
        dpsynth_ml.train(spec, dataset_path=digits_path,  # type: ignore[arg-type]
                         out_dir=tmp_path, base_model_dir=pretrained.model_dir)
    with pytest.raises(InvalidSpecError, match="batch_size"):
        nonprivate_spec(batch_size=0)


# --- what it trains ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["attention", "full"])
def test_it_trains_exactly_the_trainable_set_without_the_dp_engine(
        mode: str, pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        no_dp_engine: None) -> None:
    hooks = RecordingHooks()
    spec = nonprivate_spec(trainable=mode, epochs=2, checkpoint_every=3)
    result = train_nonprivate(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
                              base_model_dir=pretrained.model_dir)
    steps = 2 * math.ceil(NUM_RECORDS / 32)
    assert (result.steps_completed, result.stopped_early) == (steps, False)
    # leases are still asked for (NullHooks/RecordingHooks grant them); no checkpoint
    assert [(a[0], a[1]) for a in hooks.acquired] == [(0, 3), (3, 3), (6, 2)]
    assert hooks.checkpoints == [] and not (tmp_path / "checkpoints").exists()
    # uniformly shuffled minibatches: full batches of 32, each epoch's last one the rest
    assert [s["batch_size"] for s in hooks.private_stats] == [32, 32, 32, 4] * 2
    assert all(math.isfinite(s["loss"]) for s in hooks.private_stats)
    base, _ = load_model(pretrained.model_dir)
    selected = set(trainable_parameter_names(base.unet, trainable=mode))  # type: ignore[arg-type]
    before, after = model_state(pretrained.model_dir), model_state(result.model_dir)
    # frozen: bit-identical
    assert _moves(selected) <= changed_parameters(before, after) <= selected
    assert result.trainable_parameters == sum(after[k].numel() for k in selected)
    info = read_model_info(result.model_dir)
    assert info.extra["nonprivate"] is True and info.training_kind == "finetune"
    assert info.extra["trainable"] == mode and info.steps == steps
    state = read_trainer_state(tmp_path)
    assert state["nonprivate"] is True and "dp" not in state


def test_lora_trains_only_the_adapters_and_releases_them_merged(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        no_dp_engine: None) -> None:
    spec = nonprivate_spec(trainable="lora", lora_rank=2)
    result = train_nonprivate(spec, dataset_path=digits_path, out_dir=tmp_path,
                              base_model_dir=pretrained.model_dir)
    base, _ = load_model(pretrained.model_dir)
    targets = {f"unet.{t}.weight" for t in lora_target_names(base.unet)}
    changed = changed_parameters(model_state(pretrained.model_dir), model_state(result.model_dir))
    assert _moves(targets) <= changed <= targets
    info = read_model_info(result.model_dir)
    assert info.extra["nonprivate"] is True and info.extra["lora"]["merged"] is True
    assert result.trainable_parameters == sum(
        p.numel() for n, p in _lora_unet(pretrained.model_dir).named_parameters()
        if ".lora_" in n)


def _lora_unet(model_dir: Path) -> torch.nn.Module:
    from dpsynth_ml.models.trainable import add_lora

    bundle, _ = load_model(model_dir)
    add_lora(bundle.unet, rank=2, alpha=2.0)
    return bundle.unet


def test_same_seed_same_model_and_a_stop_is_honoured(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    spec = nonprivate_spec(checkpoint_every=2)
    a = train_nonprivate(spec, dataset_path=digits_path, out_dir=tmp_path / "a",
                         base_model_dir=pretrained.model_dir)
    b = train_nonprivate(spec, dataset_path=digits_path, out_dir=tmp_path / "b",
                         base_model_dir=pretrained.model_dir)
    assert not changed_parameters(model_state(a.model_dir), model_state(b.model_dir))
    stopped = train_nonprivate(spec, dataset_path=digits_path, out_dir=tmp_path / "c",
                               hooks=RecordingHooks(budget=2),
                               base_model_dir=pretrained.model_dir)
    assert (stopped.steps_completed, stopped.stopped_early) == (2, True)
    # no resume: the entry point takes no checkpoint to continue from
    assert "resume_from" not in inspect.signature(train_nonprivate).parameters
