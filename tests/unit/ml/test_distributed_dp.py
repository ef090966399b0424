"""DP-SGD on W ranks is the single-process mechanism: Poisson at rate q over disjoint shards,
noise sigma*C added once (not sigma*C*sqrt(W)), normalised by the global expected batch size.

Two CPU ranks (gloo) are spawned ONCE for the module; each runs every scenario and saves
what it saw, and the tests below check the saved results (statistics in this process).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.dp.distributed import (
    DistributedDpSgdEngine,
    ShardedPoissonSampler,
    ShardedSubjectPoissonSampler,
    shard_of,
)
from dpsynth_ml.parallel.distributed import (
    Placement,
    free_port,
    parse_devices,
    same_on_all_ranks,
    start_rank,
    stop_rank,
)
from scipy import stats
from torch import nn

from .dp_support import ZeroNoise

WORLD = 2
DIM_IN, DIM_OUT = 6, 4
# (a) sampler
N_SAMPLE, Q_SAMPLE, DRAWS = 1001, 0.05, 400
# (b) noise
SIGMA, CLIP, E_NOISE, NOISE_STEPS = 1.3, 0.7, 50, 60
# (c), (d) exactness
N_DATA, Q_DATA = 40, 0.3
E_DATA = round(Q_DATA * N_DATA)  # 12, the spec's expected batch size
# Confidence: a correct implementation fails a check with probability ~1e-6 per check.
ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM_IN, 8), nn.GroupNorm(2, 8), nn.SiLU(),
                         nn.Linear(8, DIM_OUT))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N_DATA, DIM_IN, generator=g) * 3
    return x, torch.randn(N_DATA, DIM_OUT, generator=g) * 3


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)


def _accumulate(engine: DpSgdEngine, x: torch.Tensor, y: torch.Tensor, micro: int = 2,
                scale: float = 1.0) -> None:
    for start in range(0, len(x), micro):
        out = engine.module(x[start:start + micro])
        engine.accumulate((out - y[start:start + micro]).pow(2).sum(dim=1) * scale)


def _flat_grad(engine: DpSgdEngine) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten().clone() for p in engine.params])


def _flat_params(params: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in params])


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    placement = start_rank(rank, WORLD, torch.device("cpu"), port=port)
    try:
        results: dict[str, Any] = {}
        results.update(_agreement(placement))
        results.update(_sampling(rank))
        results.update(_noise(rank))
        results.update(_exactness(rank))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        stop_rank()


def _agreement(placement: Placement) -> dict[str, Any]:
    """Ranks given different DP settings refuse to start (on every rank)."""
    out: dict[str, Any] = {"same": same_on_all_ranks(placement, [1.0, 2.0]),
                           "differ": same_on_all_ranks(placement, [1.0, float(placement.rank)])}
    model = _model()
    try:
        DistributedDpSgdEngine(model, _sgd(model), noise_multiplier=1.0 + placement.rank,
                               max_grad_norm=CLIP, expected_batch_size=E_NOISE,
                               generator=torch.Generator())
        out["refused"] = False
    except RuntimeError:
        out["refused"] = True
    return out


def _sampling(rank: int) -> dict[str, Any]:
    """(a) each rank draws its shard at rate q with its OWN OS-seeded generator."""
    from dpsynth_ml.training.entry import os_seeded_generator

    sampler = ShardedPoissonSampler(N_SAMPLE, Q_SAMPLE, os_seeded_generator(), rank=rank,
                                    world_size=WORLD)
    return {"shard": sampler.shard, "draws": [sampler.sample() for _ in range(DRAWS)]}


def _noise(rank: int) -> dict[str, Any]:
    """(b) zero gradients on every rank: the released step is pure noise."""
    model = _model()
    engine = DistributedDpSgdEngine(model, _sgd(model), noise_multiplier=SIGMA,
                                    max_grad_norm=CLIP, expected_batch_size=E_NOISE,
                                    generator=torch.Generator().manual_seed(100 + rank))
    x, y = _data()
    rows = []
    for step in range(NOISE_STEPS):
        if step % 2:  # examples whose loss (hence gradient) is zero, on both ranks
            _accumulate(engine, x[:5], y[:5], scale=0.0)
        engine.privatize()  # even steps: empty samples on both ranks
        rows.append(_flat_grad(engine) * E_NOISE)  # undo the normalisation: sum + noise
        engine.discard()
    engine.close()
    return {"noise": torch.stack(rows)}


def _exactness(rank: int) -> dict[str, Any]:
    """(c) noiseless gradient and (d) one noisy step equal the single-process ones."""
    x, y = _data()
    out: dict[str, Any] = {}
    sampler = ShardedPoissonSampler(N_DATA, Q_DATA, torch.Generator().manual_seed(11 + rank),
                                    rank=rank, world_size=WORLD)
    mine = sampler.sample()
    union: list[Any] = [None] * WORLD
    dist.all_gather_object(union, mine)
    indices = torch.cat(union)
    out["union"] = indices

    # (c) no noise (an injected zero source, test code only): the distributed gradient vs
    # one process on the union of the samples
    model = _model()
    engine = DistributedDpSgdEngine(model, _sgd(model), noise_multiplier=1.0,
                                    max_grad_norm=0.5, expected_batch_size=E_DATA,
                                    generator=torch.Generator().manual_seed(0),
                                    _test_noise=ZeroNoise())
    _accumulate(engine, x[mine], y[mine])
    engine.privatize()
    out["grad"] = _flat_grad(engine)
    engine.close()
    if rank == 0:
        single_model = _model()
        single = DpSgdEngine(single_model, _sgd(single_model), noise_multiplier=1.0,
                             max_grad_norm=0.5, expected_batch_size=E_DATA,
                             generator=torch.Generator().manual_seed(0),
                             _test_noise=ZeroNoise())
        _accumulate(single, x[indices], y[indices], micro=3)
        single.privatize()
        out["single_grad"] = _flat_grad(single)
        single.close()
        out["by_hand"] = _clipped_sum_by_hand(_model(), x[indices], y[indices], 0.5) / E_DATA

    # (d) one SGD step with noise; rank 1 starts from other weights (rank 0's are broadcast)
    model = _model(seed=0 if rank == 0 else 123)
    engine = DistributedDpSgdEngine(model, _sgd(model), noise_multiplier=1.0,
                                    max_grad_norm=0.5, expected_batch_size=E_DATA,
                                    generator=torch.Generator().manual_seed(5 + 1000 * rank))
    out["in_sync_before"] = engine.parameters_in_sync()
    _accumulate(engine, x[mine], y[mine])
    engine.privatize()
    engine.apply_update()
    out["in_sync_after"] = engine.parameters_in_sync()
    out["params"] = _flat_params(engine.params)
    engine.close()
    if rank == 0:
        single_model = _model()
        single = DpSgdEngine(single_model, _sgd(single_model), noise_multiplier=1.0,
                             max_grad_norm=0.5, expected_batch_size=E_DATA,
                             generator=torch.Generator().manual_seed(5))
        out["initial_params"] = _flat_params(single.params)
        _accumulate(single, x[indices], y[indices])
        single.privatize()
        single.apply_update()
        out["single_params"] = _flat_params(single.params)
        single.close()
    return out


def _clipped_sum_by_hand(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         clip: float) -> torch.Tensor:
    total = None
    for i in range(len(x)):
        model.zero_grad()
        (model(x[i:i + 1]) - y[i:i + 1]).pow(2).sum().backward()
        g = torch.cat([p.grad.flatten() for p in model.parameters()])
        g = g * min(1.0, clip / (float(g.norm()) + 1e-6))
        total = g if total is None else total + g
    assert total is not None
    return total


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = tmp_path_factory.mktemp("ranks")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank_main, args=(free_port(), str(out_dir)), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_ranks_with_different_settings_refuse_to_train(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["same"] and not r["differ"] and r["refused"]


# (a) sampling ---------------------------------------------------------------------------

def test_the_shards_are_disjoint_and_cover_the_dataset(ranks: list[dict[str, Any]]) -> None:
    shards = [r["shard"] for r in ranks]
    assert sum(s.numel() for s in shards) == N_SAMPLE
    assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(N_SAMPLE))
    for r, shard in zip(ranks, shards, strict=True):
        for batch in r["draws"]:
            assert torch.isin(batch, shard).all()


def test_each_rank_samples_its_shard_at_rate_q(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        trials = r["shard"].numel() * DRAWS
        hits = sum(b.numel() for b in r["draws"])
        low, high = stats.binom.interval(1 - ALPHA, trials, Q_SAMPLE)
        assert low <= hits <= high, (hits, trials * Q_SAMPLE)


def test_the_union_is_a_poisson_sample_of_the_whole_dataset(
        ranks: list[dict[str, Any]]) -> None:
    sizes = np.array([sum(r["draws"][t].numel() for r in ranks) for t in range(DRAWS)],
                     dtype=float)
    mean, var = N_SAMPLE * Q_SAMPLE, N_SAMPLE * Q_SAMPLE * (1 - Q_SAMPLE)
    # batch size ~ Binomial(N, q): mean and variance
    assert abs(sizes.mean() - mean) <= Z * math.sqrt(var / DRAWS)
    chi2 = (DRAWS - 1) * sizes.var(ddof=1) / var
    low, high = stats.chi2.interval(1 - ALPHA, DRAWS - 1)
    assert low <= chi2 <= high
    # every record, whichever rank owns it, is included ~ Binomial(DRAWS, q) times
    counts = np.zeros(N_SAMPLE)
    for r in ranks:
        for batch in r["draws"]:
            counts[batch.numpy()] += 1
    chi2_records = ((counts - DRAWS * Q_SAMPLE) ** 2).sum() / (DRAWS * Q_SAMPLE * (1 - Q_SAMPLE))
    low, high = stats.chi2.interval(1 - ALPHA, N_SAMPLE)
    assert low <= chi2_records <= high


def test_the_ranks_draw_independently(ranks: list[dict[str, Any]]) -> None:
    # Same seeds would give identical masks over the (equal-size) shards: correlation 1.
    a, b = ([float(x.numel()) for x in r["draws"]] for r in ranks)
    assert [x.numel() for x in ranks[0]["draws"]] != [x.numel() for x in ranks[1]["draws"]]
    corr = float(np.corrcoef(a, b)[0, 1])
    assert abs(corr) <= Z / math.sqrt(DRAWS)


def test_a_sharded_subject_sampler_keeps_each_subject_on_one_rank() -> None:
    rng = np.random.default_rng(0)
    num_subjects, q = 31, 0.4
    subjects = rng.integers(0, num_subjects - 1, size=200)  # the last subject has no image
    samplers = [ShardedSubjectPoissonSampler(subjects, num_subjects, q,
                                             torch.Generator().manual_seed(r), rank=r,
                                             world_size=WORLD, max_images_per_subject=3)
                for r in range(WORLD)]
    hits = np.zeros(num_subjects)
    draws = 300
    for _ in range(draws):
        seen: list[int] = []
        for rank, sampler in enumerate(samplers):
            batch = sampler.sample()
            assert (batch.subjects % WORLD == rank).all()
            # every image belongs to its group's subject; at most 3 images per subject
            assert torch.equal(torch.as_tensor(subjects)[batch.indices],
                               batch.subjects[batch.groups])
            assert (batch.counts <= 3).all()
            seen += batch.subjects.tolist()
        assert len(seen) == len(set(seen))
        hits[seen] += 1
    with_images = np.bincount(subjects, minlength=num_subjects) > 0
    trials = int(with_images.sum()) * draws
    low, high = stats.binom.interval(1 - ALPHA, trials, q)
    assert low <= hits[with_images].sum() <= high
    assert hits[~with_images].sum() == 0


# (b) noise ------------------------------------------------------------------------------

def test_the_noise_is_added_once_with_std_sigma_c(ranks: list[dict[str, Any]]) -> None:
    noise = ranks[0]["noise"].double()
    assert torch.equal(noise, ranks[1]["noise"].double())  # every rank applies the same step
    n = noise.numel()
    assert abs(float(noise.mean())) <= Z * SIGMA * CLIP / math.sqrt(n)
    # sum x^2 / (sigma C)^2 ~ chi2(n) under N(0, (sigma C)^2)
    low, high = stats.chi2.interval(1 - ALPHA, n)
    assert low <= float((noise ** 2).sum()) / (SIGMA * CLIP) ** 2 <= high
    # ... and far from the once-per-rank variance W (sigma C)^2
    assert not low <= float((noise ** 2).sum()) / (WORLD * (SIGMA * CLIP) ** 2) <= high
    assert len({tuple(row[:3].tolist()) for row in noise}) == NOISE_STEPS  # fresh per step


# (c), (d) exactness ---------------------------------------------------------------------

def test_without_noise_the_gradient_equals_single_process(ranks: list[dict[str, Any]]) -> None:
    assert ranks[0]["union"].numel() > 0
    for r in ranks:
        assert torch.allclose(r["grad"], ranks[0]["single_grad"], rtol=1e-5, atol=1e-7)
    # the clipped sum over all sampled examples, divided by the GLOBAL E = q N (not E / W)
    assert torch.allclose(ranks[0]["grad"], ranks[0]["by_hand"], rtol=1e-4, atol=1e-6)


def test_one_noisy_step_equals_single_process(ranks: list[dict[str, Any]]) -> None:
    assert all(r["in_sync_before"] and r["in_sync_after"] for r in ranks)
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert torch.allclose(ranks[0]["params"], ranks[0]["single_params"], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ranks[0]["params"], ranks[0]["initial_params"])


# placement ------------------------------------------------------------------------------

def test_placement_and_device_lists() -> None:
    assert Placement().device == torch.device("cpu") and not Placement().distributed
    assert Placement(rank=1, world_size=2).backend == "gloo"
    with pytest.raises(ValueError):
        Placement(rank=2, world_size=2)
    assert parse_devices("cpu") == [torch.device("cpu")]
    for bad in ("", "tpu", "cuda:0,cpu" if torch.cuda.device_count() else "cuda:0"):
        with pytest.raises(ValueError):
            parse_devices(bad)
    assert shard_of(5, 1, 2).tolist() == [1, 3]


def test_the_engine_needs_a_process_group() -> None:
    model = _model()
    with pytest.raises(RuntimeError, match="process group"):
        DistributedDpSgdEngine(model, _sgd(model), noise_multiplier=1.0, max_grad_norm=1.0,
                               expected_batch_size=4, generator=torch.Generator())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cpu_generator_noises_a_gpu_model() -> None:
    from dpsynth_ml.dp.noise import ChaChaGaussian

    model = _model().cuda()
    engine = DpSgdEngine(model, _sgd(model), noise_multiplier=1.0, max_grad_norm=1.0,
                         expected_batch_size=4, generator=torch.Generator().manual_seed(3))
    engine.privatize()
    noise = _flat_grad(engine) * 4
    assert noise.is_cuda
    # drawn on the GPU from the ChaCha20 source keyed by the test generator: the same
    # values as on the CPU (docs/privacy.md, "The noise source")
    expected = ChaChaGaussian.keyed_by(torch.Generator().manual_seed(3)).gaussian(
        (noise.numel(),), 1.0, device=torch.device("cpu"), dtype=torch.float32)
    assert torch.allclose(noise[:expected.numel()].cpu(), expected)


# the finetune loop on two ranks -----------------------------------------------------------

def test_a_two_rank_finetune_obeys_rank_zeros_lease_and_only_rank_zero_writes(
        pretrained: Any, digits_path: Path, tmp_path: Path) -> None:
    """This process is rank 0 (with the hooks), one spawned rank follows; 3 of 4 steps leased."""
    import json

    from dpsynth_ml.parallel.ranks import train_on_ranks

    from .support import RecordingHooks, finetune_spec

    hooks = RecordingHooks(budget=3)
    spec = finetune_spec(dp_steps=4, checkpoint_every=2, dp_sample_rate=0.1,
                         dp_expected_batch_size=10)
    result = train_on_ranks([torch.device("cpu")] * WORLD, spec, dataset_path=digits_path,
                            out_dir=tmp_path / "out", hooks=hooks,
                            base_model_dir=pretrained.model_dir, timeout_s=120, _test_seed=1000)
    assert not dist.is_initialized()
    # rank 1 ran the same 3 steps, else rank 0 would have failed in a collective
    assert result.steps_completed == 3 and result.stopped_early
    assert hooks.acquired == [(0, 2, 2), (2, 2, 1), (3, 1, 0)]
    assert hooks.progress == [(s, 4) for s in (1, 2, 3)]
    # checkpoints (each preceded by the collective in-sync check of the model copies)
    assert [s for s, _ in hooks.checkpoints] == [2, 3]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "checkpoints", "model", "trainer_state.json"]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["sampler"]["sample_rate"] == 0.1
    # the sampler counts the whole dataset (q is relative to N, not to a shard)
    with np.load(digits_path) as npz:
        assert state["sampler"]["num_records"] == len(npz["labels"])
    # private statistics are the sums over both ranks' samples
    assert len(hooks.private_stats) == 3
    assert all(s["batch_size"] >= 0 and 0 <= s["fraction_clipped"] <= 1
               for s in hooks.private_stats)
