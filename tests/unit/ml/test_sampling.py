"""Poisson sampling: the statistics of PoissonSampler and that the trainer uses q exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.dp import PoissonSampler
from dpsynth_ml.spec import InvalidSpecError
from safetensors.torch import load_file

from .support import NUM_RECORDS, RecordingHooks, finetune_spec, seeded


def test_batch_sizes_follow_binomial_n_q() -> None:
    n, q, draws = 500, 0.037, 2000
    sampler = PoissonSampler(n, q, torch.Generator().manual_seed(3))
    sizes = torch.tensor([len(sampler.sample()) for _ in range(draws)], dtype=torch.float64)
    mean, var = n * q, n * q * (1 - q)
    # SE of the sample mean: sqrt(var/draws); of the sample variance ~ var*sqrt(2/(draws-1)).
    assert abs(sizes.mean().item() - mean) < 5 * math.sqrt(var / draws)
    assert abs(sizes.var().item() - var) < 5 * var * math.sqrt(2 / (draws - 1))
    assert sampler.draws == draws


def test_each_record_is_included_independently_with_rate_q() -> None:
    n, q, draws = 40, 0.25, 2000
    sampler = PoissonSampler(n, q, torch.Generator().manual_seed(5))
    counts = torch.zeros(n)
    for _ in range(draws):
        batch = sampler.sample()
        assert batch.dtype == torch.long and torch.equal(batch, batch.unique())  # no repeats
        counts[batch] += 1
    rates = counts / draws
    assert (rates - q).abs().max() < 5 * math.sqrt(q * (1 - q) / draws)


def test_sampler_can_return_empty_batches_and_has_no_cap() -> None:
    sampler = PoissonSampler(10, 1e-9, torch.Generator().manual_seed(0))
    assert sampler.sample().numel() == 0
    assert PoissonSampler(10, 1.0, torch.Generator().manual_seed(0)).sample().numel() == 10


def test_finetune_uses_exactly_the_accounted_sample_rate(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    q = 0.1637  # not representable in float32: a float32 comparison would change it
    spec = finetune_spec(dp_sample_rate=q, dp_steps=20)
    hooks = RecordingHooks()
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    assert result.steps_completed == 20 and not result.stopped_early
    assert state["sampler"]["sample_rate"] == spec.privacy.dp.sample_rate  # type: ignore[union-attr]
    assert float.fromhex(state["sampler"]["sample_rate_hex"]) == q
    assert state["sampler"]["num_records"] == NUM_RECORDS
    assert state["sampler"]["draws_this_attempt"] == 20 == state["step"]
    sizes = [s["batch_size"] for s in hooks.private_stats]
    assert len(sizes) == 20
    # Realised sizes vary (Poisson), and their mean is plausible for Binomial(100, q).
    assert len(set(sizes)) > 1
    assert abs(sum(sizes) / 20 - NUM_RECORDS * q) < 5 * math.sqrt(NUM_RECORDS * q / 20)


def test_empty_batch_still_adds_noise_and_counts_as_a_step(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    # q = 1e-4 over the fixture's records: with this seed both Poisson batches are empty
    # (each step still runs its fixed padded rows, sized for N̂ = B / q = 10,000)
    spec = finetune_spec(dp_sample_rate=1e-4, dp_steps=2, dp_expected_batch_size=1)
    hooks = RecordingHooks()
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    assert result.steps_completed == 2
    assert [s["batch_size"] for s in hooks.private_stats] == [0.0, 0.0]
    with pytest.raises(InvalidSpecError, match="public size"):
        train(finetune_spec(dp_sample_rate=1e-12, dp_steps=2, dp_expected_batch_size=4),
              dataset_path=digits_path, out_dir=tmp_path / "absurd", hooks=RecordingHooks(),
              base_model_dir=pretrained.model_dir, _test_generator=seeded())
    before = load_file(str(pretrained.model_dir / "unet" / "diffusion_pytorch_model.safetensors"))
    after = load_file(str(result.model_dir / "unet" / "diffusion_pytorch_model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all(".attn1." in k or ".attn2." in k for k in changed)
