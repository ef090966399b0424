"""Large logical batches: one Poisson draw per step, split into physical micro-batches.

Splitting must not change the step: a micro-batched logical step equals the unsplit one with
the same sample and the same noise; the realised size is Binomial(N, q) and never capped.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.dp.padding import fixed_batch
from dpsynth_ml.training.finetune import loop as ft_loop

from .dp_support import examples, make_engine, noisy_sum, one_thread, tiny_denoiser
from .recording import KeyedDraws, RecordingEngine, RecordingSampler, recording
from .support import NUM_RECORDS, RecordingHooks, finetune_spec, seeded

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["one_thread", "recording"]


@pytest.mark.parametrize("draws", [1, 3])
def test_engine_micro_batched_step_equals_the_unsplit_step(draws: int) -> None:
    model = tiny_denoiser()
    ex = examples(7, draws, seed=5)
    rows = torch.arange(len(ex))
    clip = 0.02  # most examples clipped: clipping happens per example in either split
    released = {}
    for micro in (1, 3, len(ex)):
        engine = make_engine(model, sigma=1.0, clip=clip, expected=4, seed=99)  # same noise
        released[micro] = noisy_sum(engine, ex, rows, draws=draws, micro=micro)
        engine.close()
    for micro in (1, 3):
        torch.testing.assert_close(released[micro], released[len(ex)], rtol=0, atol=1e-6)
    assert released[1].abs().max() > 1e-3  # a real release, not zeros


@pytest.mark.usefixtures("recording")
def test_trainer_micro_batched_steps_equal_the_unsplit_steps(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Same test generator in both runs => same Poisson samples, label dropout and DP noise;
    # the diffusion draws are keyed by example, so only the split differs. (A class_map
    # keeps the base class table: a fresh one would be initialised differently per run.)
    runs = {}
    for physical in (3, 64):
        draws = KeyedDraws()
        monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", draws)
        spec = finetune_spec(max_physical_batch_size=physical, noise_multiplicity=2,
                             class_map={i: i for i in range(10)},
                             dp_steps=2, dp_sample_rate=0.25, checkpoint_every=2,
                             learning_rate=1e-9)
        train(spec, dataset_path=digits_path, out_dir=tmp_path / str(physical),
              base_model_dir=pretrained.model_dir, _test_generator=seeded(21))
        runs[physical] = (RecordingEngine.instances[-1], RecordingSampler.instances[-1], draws)
    (split, split_sampler, split_draws), (whole, whole_sampler, _) = runs[3], runs[64]
    sizes = [len(b) for b in whole_sampler.batches]
    assert max(sizes) > 3  # the split run really used several micro-batches
    # every step runs the fixed, public number of rows (padding masked; dp.padding), K = 2
    fixed = fixed_batch(sample_rate=0.25, expected_batch_size=16, steps=2, epsilon=None,
                        delta=None)
    assert split_draws.rows == 2 * sum(fixed.rows_for(s) for s in sizes)
    for a, b in zip(split_sampler.batches, whole_sampler.batches, strict=True):
        assert torch.equal(a, b)
    assert len(split.released) == len(whole.released) == 2
    for a, b in zip(split.released, whole.released, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(split.noise, whole.noise, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.usefixtures("recording")
def test_realised_batch_is_never_capped(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    draws = KeyedDraws()
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", draws)
    hooks = RecordingHooks()
    # q = 1: every record is in the batch, 100 > expected_batch_size 16 > physical size 8.
    spec = finetune_spec(dp_sample_rate=1.0, dp_steps=1, dp_expected_batch_size=16,
                         max_physical_batch_size=8, checkpoint_every=1)
    train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
          base_model_dir=pretrained.model_dir, _test_generator=seeded())
    (sampler,) = RecordingSampler.instances
    assert [len(b) for b in sampler.batches] == [NUM_RECORDS]
    assert hooks.private_stats[0]["batch_size"] == NUM_RECORDS
    # every sampled example went through the loss: N̂ = 16 / 1 caps the step at 16 rows, so
    # the 100 (more than the declared N̂ would allow) are processed in 7 padded chunks of 16
    assert draws.rows == hooks.private_stats[0]["rows"] == 112


@pytest.mark.usefixtures("recording")
def test_finetune_batch_sizes_follow_binomial_n_q(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    q, steps = 0.05, 40
    hooks = RecordingHooks()
    spec = finetune_spec(dp_sample_rate=q, dp_steps=steps, max_physical_batch_size=4,
                         checkpoint_every=steps)
    train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
          base_model_dir=pretrained.model_dir, _test_generator=seeded(8))
    (sampler,) = RecordingSampler.instances
    assert (sampler.num_records, sampler.sample_rate, sampler.draws) == (NUM_RECORDS, q, steps)
    sizes = torch.tensor([float(len(b)) for b in sampler.batches], dtype=torch.float64)
    assert sizes.tolist() == [s["batch_size"] for s in hooks.private_stats]
    mean, var = NUM_RECORDS * q, NUM_RECORDS * q * (1 - q)
    assert abs(sizes.mean().item() - mean) < 4 * math.sqrt(var / steps)
    assert abs(sizes.var().item() - var) < 4 * var * math.sqrt(2 / (steps - 1))


@pytest.mark.usefixtures("recording")
def test_an_out_of_memory_step_is_redone_on_the_same_batch_with_smaller_micro_batches(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that runs out of memory in a step's second micro-batch (after the first one was
    clipped and summed): the step's partial sum is discarded and the SAME Poisson batch is
    redone in micro-batches of half the size, for the rest of the run. The released steps
    equal a run that used the smaller size from the start (same samples, same noise; the
    diffusion draws keyed by example, the failed attempt's draws not counted: they are
    data-independent randomness either way), so nothing of the failed attempt leaks into
    them."""
    from dpsynth_ml import read_model_info

    original, original_step = ft_loop._on_device, ft_loop._record_micro_batches
    runs = {}
    for physical, inject in ((4, False), (8, True)):
        draws = KeyedDraws()
        monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", draws)
        big: list[int] = []

        def attempt(run: object, *args: object, draws: KeyedDraws = draws) -> object:
            counts = dict(draws.counts)
            try:
                return original_step(run, *args)  # type: ignore[arg-type]
            except torch.cuda.OutOfMemoryError:
                draws.counts.clear()
                draws.counts.update(counts)
                raise

        monkeypatch.setattr(ft_loop, "_record_micro_batches", attempt)

        def on_device(run: object, *tensors: torch.Tensor, inject: bool = inject,
                      big: list[int] = big) -> tuple[torch.Tensor, ...]:
            if inject and tensors[0].shape[0] > 4:
                big.append(1)
                if len(big) % 2 == 0:  # every second large micro-batch: after a sum
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
            return original(run, *tensors)  # type: ignore[arg-type]

        monkeypatch.setattr(ft_loop, "_on_device", on_device)
        spec = finetune_spec(max_physical_batch_size=physical, noise_multiplicity=2,
                             class_map={i: i for i in range(10)},
                             dp_steps=2, dp_sample_rate=0.25, checkpoint_every=2,
                             learning_rate=1e-9)
        result = train(spec, dataset_path=digits_path, out_dir=tmp_path / str(physical),
                       base_model_dir=pretrained.model_dir, _test_generator=seeded(21))
        runs[physical] = (RecordingEngine.instances[-1], RecordingSampler.instances[-1],
                          result, len(big))
    (clean, clean_sampler, _, _), (retried, retried_sampler, result, large) = runs[4], runs[8]
    assert large == 2  # one large micro-batch summed, the next one failed, then size 4
    for a, b in zip(retried_sampler.batches, clean_sampler.batches, strict=True):
        assert torch.equal(a, b)
    assert len(retried.released) == len(clean.released) == 2  # noised once per step
    for a, b in zip(retried.released, clean.released, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert read_model_info(result.model_dir).extra["micro_batch_after_out_of_memory"] == 4


def test_an_out_of_memory_error_stands_where_a_retry_is_not_clean() -> None:
    from types import SimpleNamespace

    from dpsynth_ml.dp import BookKeepingEngine

    def run(size: int, distributed: bool, engine: object) -> object:
        return SimpleNamespace(physical_batch=0, engine=engine,
                               spec=SimpleNamespace(max_physical_batch_size=size),
                               placement=SimpleNamespace(distributed=distributed))

    bookkeeping = BookKeepingEngine.__new__(BookKeepingEngine)  # never stepped
    assert not ft_loop._smaller_micro_batches(run(8, False, object()))  # opacus hooks
    assert not ft_loop._smaller_micro_batches(run(8, True, bookkeeping))  # several ranks
    assert not ft_loop._smaller_micro_batches(run(1, False, bookkeeping))  # nothing smaller
