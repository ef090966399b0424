"""EMA of the trained weights, learning-rate warm-up, and exact resume with fresh noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.training.finetune import checkpoints as ft_checkpoints
from safetensors.torch import load_file

from .dp_support import one_thread
from .recording import RecordingEngine, RecordingSampler, recording
from .support import RecordingHooks, finetune_spec, seeded

pytestmark = pytest.mark.usefixtures("one_thread", "recording")
__all__ = ["one_thread", "recording"]

LR, WARMUP, DECAY = 1e-3, 4, 0.9


def _spec(**overrides: object):  # type: ignore[no-untyped-def]
    fields: dict[str, object] = dict(dp_steps=8, dp_sample_rate=0.1, checkpoint_every=5,
                                     learning_rate=LR, warmup_steps=WARMUP, ema_decay=DECAY)
    fields.update(overrides)
    return finetune_spec(**fields)


def _unet_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "unet" / "diffusion_pytorch_model.safetensors"))


def _checkpoint_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out = {}
    for name in ("optimizer", "trainable", "ema"):
        out.update({f"{name}/{k}": v for k, v in load_file(str(ckpt / f"{name}.safetensors"))
                    .items()})
    out.update({f"unet/{k}": v for k, v in _unet_weights(ckpt).items()})
    return out


def test_warmup_is_linear_over_logical_steps_and_ema_is_released(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    result = train(_spec(dp_steps=6, checkpoint_every=6), dataset_path=digits_path,
                   out_dir=tmp_path, base_model_dir=pretrained.model_dir,
                   _test_generator=seeded())
    (engine,) = RecordingEngine.instances
    assert engine.learning_rates == pytest.approx([LR * f for f in (.25, .5, .75, 1, 1, 1)])
    # The EMA of the raw trained weights, with diffusers' EMAModel schedule:
    # decay_n = min(DECAY, (1 + n) / (10 + n)) for update n >= 2 (the first copies).
    names = json.loads((tmp_path / "trainer_state.json").read_text())[
        "trainable_parameter_names"]
    base = _unet_weights(pretrained.model_dir)
    shadow = [base[n.removeprefix("unet.")].clone() if n.startswith("unet.") else None
              for n in names]
    for n, raw in enumerate(engine.raw_after_step, start=1):
        decay = 0.0 if n <= 1 else min(DECAY, n / (9 + n))
        shadow = [raw_p.clone() if s is None else s - (1 - decay) * (s - raw_p)
                  for s, raw_p in zip(shadow, raw, strict=True)]
    released = _unet_weights(result.model_dir)
    ckpt = tmp_path / "checkpoints" / "step-0000006"
    saved_raw, saved_ema = (load_file(str(ckpt / f)) for f in ("trainable.safetensors",
                                                              "ema.safetensors"))
    unet_names = [n for n in names if n.startswith("unet.")]
    assert unet_names
    for name, expected, raw in zip(names, shadow, engine.raw_after_step[-1], strict=True):
        torch.testing.assert_close(saved_ema[name], expected, rtol=1e-5, atol=1e-7)
        assert torch.equal(saved_raw[name], raw)
        if name.startswith("unet."):
            torch.testing.assert_close(released[name.removeprefix("unet.")], expected,
                                       rtol=1e-5, atol=1e-7)
    # The released weights are the average, not the raw weights.
    assert any(not torch.equal(released[n.removeprefix("unet.")], saved_raw[n])
               for n in unet_names)
    assert torch.equal(_unet_weights(ckpt)[unet_names[0].removeprefix("unet.")],
                       released[unet_names[0].removeprefix("unet.")])


def test_resume_restores_model_optimizer_ema_and_schedule_exactly(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Record the generator state when the step-5 checkpoint is written, so that a test can
    # hand the resumed attempt the very randomness the uninterrupted run used next. The
    # trainer itself never saves or restores randomness.
    states: dict[int, torch.Tensor] = {}
    real_checkpoint = ft_checkpoints.checkpoint

    def checkpoint(run, step, hooks):  # type: ignore[no-untyped-def]
        states[step] = run.generator.get_state()
        real_checkpoint(run, step, hooks)

    monkeypatch.setattr(ft_checkpoints, "checkpoint", checkpoint)
    train(_spec(), dataset_path=digits_path, out_dir=tmp_path / "a",
          base_model_dir=pretrained.model_dir, _test_generator=seeded(1))
    uninterrupted = RecordingEngine.instances[-1]
    replay = torch.Generator()
    replay.set_state(states[5])
    hooks = RecordingHooks()
    train(_spec(), dataset_path=digits_path, out_dir=tmp_path / "b", hooks=hooks,
          resume_from=tmp_path / "a" / "checkpoints" / "step-0000005",
          _test_generator=replay)
    resumed = RecordingEngine.instances[-1]
    assert hooks.acquired == [(5, 3, 3)]
    # Warm-up continues from step 5 (already at the full rate); same lr as uninterrupted.
    assert resumed.learning_rates == uninterrupted.learning_rates[5:]
    # Same randomness from step 5 on => the same steps, hence the same final state of
    # every restored part: raw weights, optimizer moments, EMA, released model.
    a = _checkpoint_tensors(tmp_path / "a" / "checkpoints" / "step-0000008")
    b = _checkpoint_tensors(tmp_path / "b" / "checkpoints" / "step-0000008")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=key)
    sa, sb = (json.loads((tmp_path / r / "trainer_state.json").read_text()) for r in "ab")
    assert sa["ema"] == sb["ema"] == {"decay": DECAY, "optimization_step": 8}
    assert sa["lr_schedule"] == sb["lr_schedule"]
    assert (sb["start_step"], sb["step"]) == (5, 8)


def test_resumed_attempt_replays_steps_with_fresh_noise_and_batches(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    first = RecordingHooks(budget=8)
    train(_spec(dp_steps=10), dataset_path=digits_path, out_dir=tmp_path / "a", hooks=first,
          base_model_dir=pretrained.model_dir, _test_generator=seeded(1))
    assert [s for s, _ in first.checkpoints] == [5, 8]
    engine_a, sampler_a = RecordingEngine.instances[-1], RecordingSampler.instances[-1]
    # The worker died after step 8; the newest checkpoint it kept is step 5.
    second = RecordingHooks()
    result = train(_spec(dp_steps=10), dataset_path=digits_path, out_dir=tmp_path / "b",
                   hooks=second, resume_from=tmp_path / "a" / "checkpoints" / "step-0000005",
                   _test_generator=seeded(2))
    engine_b, sampler_b = RecordingEngine.instances[-1], RecordingSampler.instances[-1]
    assert result.steps_completed == 10
    assert second.acquired == [(5, 5, 5)]  # steps 5..7 run again: new releases, charged
    for replayed in range(3):  # steps 5, 6, 7 of both attempts
        a_batch, b_batch = sampler_a.batches[5 + replayed], sampler_b.batches[replayed]
        assert not torch.equal(a_batch, b_batch)
        noise_a, noise_b = engine_a.noise[5 + replayed], engine_b.noise[replayed]
        assert noise_a.abs().max() > 0 and not torch.allclose(noise_a, noise_b)
