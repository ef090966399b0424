"""The platform's veto: step leases, stop requests, checkpoints and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpsynth_ml import InvalidSpecError, TrainingResult, train

from .support import RecordingHooks, finetune_spec, seeded


def _run(pretrained: TrainingResult, digits_path: Path, out: Path, hooks: RecordingHooks,
         **overrides: object) -> TrainingResult:
    spec = finetune_spec(dp_sample_rate=0.1, **overrides)
    return train(spec, dataset_path=digits_path, out_dir=out, hooks=hooks,
                 base_model_dir=pretrained.model_dir, _test_generator=seeded())


def test_partial_grant_stops_at_exactly_the_granted_steps(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    hooks = RecordingHooks(budget=7)
    result = _run(pretrained, digits_path, tmp_path, hooks, dp_steps=20, checkpoint_every=5)
    assert result.steps_completed == 7 and result.stopped_early
    # Steps are leased before they run, in chunks of checkpoint_every.
    assert hooks.acquired == [(0, 5, 5), (5, 5, 2), (7, 5, 0)]
    assert len(hooks.private_stats) == 7
    assert hooks.progress == [(s, 20) for s in range(1, 8)]
    assert [s for s, _ in hooks.checkpoints] == [5, 7]
    assert json.loads((tmp_path / "trainer_state.json").read_text())["step"] == 7


def test_zero_grant_runs_no_step(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    hooks = RecordingHooks(budget=0)
    result = _run(pretrained, digits_path, tmp_path, hooks, dp_steps=20)
    assert result.steps_completed == 0 and result.stopped_early
    assert hooks.private_stats == [] and hooks.checkpoints == []


def test_should_stop_stops_at_a_step_boundary(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    hooks = RecordingHooks(stop_after=3)
    result = _run(pretrained, digits_path, tmp_path, hooks, dp_steps=20, checkpoint_every=10)
    assert result.steps_completed == 3 and result.stopped_early
    assert hooks.acquired == [(0, 10, 10)]  # granted 10, ran 3: the rest is the ledger's
    assert len(hooks.private_stats) == 3
    assert [s for s, _ in hooks.checkpoints] == [3]


def test_resume_continues_from_the_checkpoint_with_fresh_randomness(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    first = RecordingHooks(budget=5)
    _run(pretrained, digits_path, tmp_path / "a", first, dp_steps=8, checkpoint_every=5)
    (step, ckpt), = first.checkpoints
    assert step == 5 and (ckpt / "optimizer.safetensors").is_file()
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    # No RNG state is checkpointed: DP noise and sampling are never replayed.
    assert set(saved) == {"kind", "step", "dp", "sampler", "start_step",
                          "trainable_parameter_names", "noise_multiplicity", "lr_schedule",
                          "ema", "fixed_batch"}
    assert not {p.name for p in ckpt.iterdir()} & {"rng_state.pth", "random_states_0.pkl"}
    hooks = RecordingHooks()
    spec = finetune_spec(dp_sample_rate=0.1, dp_steps=8, checkpoint_every=5)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path / "b", hooks=hooks,
                   resume_from=ckpt, _test_generator=seeded())
    assert result.steps_completed == 8 and not result.stopped_early
    assert hooks.acquired == [(5, 3, 3)]
    state = json.loads((tmp_path / "b" / "trainer_state.json").read_text())
    assert (state["start_step"], state["step"], state["sampler"]["draws_this_attempt"]) == (5, 8, 3)


def test_resume_under_a_different_dp_spec_is_refused(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    first = RecordingHooks(budget=2)
    _run(pretrained, digits_path, tmp_path / "a", first, dp_steps=4, checkpoint_every=2)
    (_, ckpt), = first.checkpoints
    spec = finetune_spec(dp_sample_rate=0.2, dp_steps=4)
    with pytest.raises(InvalidSpecError):
        train(spec, dataset_path=digits_path, out_dir=tmp_path / "b", resume_from=ckpt,
              _test_generator=seeded())
