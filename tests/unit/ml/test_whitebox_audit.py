"""White-box one-run audits through both DP-SGD engines (issue 19, item 3, "teeth").

The correct mechanism's lower bound stays below the epsilon the ledger's accountant claims
for it; the broken mechanisms the one-run bound can see at this size (noise off, no
clipping) are caught at every claimed epsilon in {0.5, 1, 2}. The broken objects are built
here, in test code, and passed in (a zero noise source, engines that do not clip): no spec,
API field or setting reaches them.

What the (epsilon, delta) bound cannot see at this size (a sigma twice too small, a sampling
rate twice the accounted one) is measured by ``benchmarks/audit_power.py`` and stated in
docs/privacy.md; the f-DP analysis against the claim's GDP envelope catches those, and noise
added per micro-batch (4 draws of a quarter of the std), at 200,000 one-hot canaries
(the tests at the end).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier
from dpsynth_ml.audit.whitebox import DiracCanaries, WhiteBoxAudit, white_box_audit
from dpsynth_ml.dp import BookKeepingEngine, DpSgdEngine
from dpsynth_ml.dp.engine import SourcedNoiseDPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn

from tests.unit.ml.dp_support import ZeroNoise

pytestmark = pytest.mark.unit

DELTA = 1e-5
Q, STEPS, CANARIES, EXPECTED = 0.1, 50, 1000, 64
CLIP = 0.5


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 24), nn.Tanh(), nn.Linear(24, 8))  # 1,184 values


class UnclippedOptimizer(SourcedNoiseDPOptimizer):
    """BROKEN (test code only): sums the per-example gradients without clipping them."""

    def clip_and_accumulate(self) -> None:
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            grad = self._get_flat_grad_sample(p).sum(0)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)


class UnclippedHooksEngine(DpSgdEngine):
    def _dp_optimizer(self, optimizer: torch.optim.Optimizer, **kwargs: object
                      ) -> SourcedNoiseDPOptimizer:
        return UnclippedOptimizer(optimizer, loss_reduction="mean", **kwargs)


class UnclippedBookKeepingEngine(BookKeepingEngine):
    def _clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(norms)


MICRO_BATCHES = 4


class PerMicroBatchNoiseEngine(BookKeepingEngine):
    """The seeds' bug: each of the logical step's 4 micro-batches noised on its own with
    std sigma C / 4, "so that the sum keeps the noise": the step's noise std is then
    sigma C / 2, half what the accountant counts."""

    def _noised(self, sums: list[torch.Tensor]) -> list[torch.Tensor]:
        sigma = self.noise_multiplier
        self.noise_multiplier = sigma / MICRO_BATCHES
        try:
            for _ in range(MICRO_BATCHES):
                sums = super()._noised(sums)
        finally:
            self.noise_multiplier = sigma
        return sums


ENGINES: dict[str, tuple[type[DpSgdEngine] | type[BookKeepingEngine], ...]] = {
    "hooks": (DpSgdEngine, UnclippedHooksEngine),
    "bookkeeping": (BookKeepingEngine, UnclippedBookKeepingEngine),
}


def _run(kind: str, *, sigma: float, seed: int, broken: str | None = None,
         records: bool = False) -> WhiteBoxAudit:
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    correct, unclipped = ENGINES[kind]
    cls = unclipped if broken == "no clipping" else correct
    engine = cls(model, torch.optim.SGD(params, lr=0.05), noise_multiplier=sigma,
                 max_grad_norm=CLIP, expected_batch_size=EXPECTED,
                 generator=torch.Generator().manual_seed(seed),
                 _test_noise=ZeroNoise() if broken == "no noise" else None)
    g = torch.Generator().manual_seed(1000 + seed)
    canaries = DiracCanaries.draw(sum(p.numel() for p in params), CANARIES, g)
    records_step = _records(engine, g) if records else None
    try:
        return white_box_audit(engine, canaries, steps=STEPS, sample_rate=Q,
                               expected_batch_size=EXPECTED, generator=g, delta=DELTA,
                               records_step=records_step)
    finally:
        engine.close()


def _records(engine: DpSgdEngine | BookKeepingEngine,
             g: torch.Generator) -> Callable[[], None]:
    """Stand-in records: 200 random (x, y) pairs, Poisson-sampled like the canaries."""
    x, y = torch.randn(200, 40, generator=g), torch.randn(200, 8, generator=g)

    def step() -> None:
        rows = (torch.rand(200, generator=g) < Q).nonzero().flatten()
        if rows.numel():
            engine.accumulate((engine.module(x[rows]) - y[rows]).pow(2).sum(1))

    return step


@pytest.mark.parametrize("kind", list(ENGINES))
def test_without_noise_each_score_is_the_clipped_canary_times_its_presences(kind: str) -> None:
    result = _run(kind, sigma=1.0, seed=0, broken="no noise")
    g = torch.Generator().manual_seed(1000)
    canaries = DiracCanaries.draw(1184, CANARIES, g)
    # replay the sampler: the canaries' scores are C per presence, exactly (clipped 10 C)
    members = canaries.included.nonzero().flatten()
    counts = torch.zeros(CANARIES, dtype=torch.float64)
    for _ in range(STEPS):
        u = torch.rand(int(members.numel()), generator=g, dtype=torch.float64)
        counts[members[u < Q]] += 1
    np.testing.assert_allclose(result.scores, CLIP * counts.numpy(), rtol=1e-5, atol=1e-5)
    assert result.presences == int(counts.sum())
    assert not result.scores[~canaries.included.numpy()].any()


@pytest.mark.parametrize("kind", list(ENGINES))
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_the_correct_mechanism_stays_below_its_claim_and_broken_ones_are_caught(
        kind: str, eps: float) -> None:
    sigma = calibrate_noise_multiplier(eps, Q, STEPS, DELTA)
    correct = _run(kind, sigma=sigma, seed=1, records=True)
    assert correct.bound.epsilon_lower_bound <= eps, correct.bound
    for broken in ("no noise", "no clipping"):
        caught = _run(kind, sigma=sigma, seed=2, broken=broken)
        assert caught.bound.epsilon_lower_bound > eps, (broken, caught.bound)
        assert caught.bound.epsilon_lower_bound > 1.5


def test_canaries_are_distinct_and_refuse_impossible_requests() -> None:
    g = torch.Generator().manual_seed(3)
    canaries = DiracCanaries.draw(500, 500, g)
    assert sorted(canaries.coordinates.tolist()) == list(range(500))
    assert 200 < int(canaries.included.sum()) < 300
    with pytest.raises(ValueError, match="coordinates"):
        DiracCanaries.draw(10, 11, g)
    with pytest.raises(ValueError, match="norm"):
        DiracCanaries.draw(10, 5, g, norm=0.0)
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    engine = BookKeepingEngine(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0,
                               max_grad_norm=1.0, expected_batch_size=8,
                               generator=torch.Generator().manual_seed(0))
    outside = DiracCanaries(coordinates=torch.tensor([5000]), included=torch.tensor([True]))
    with pytest.raises(ValueError, match="trainable values"):
        white_box_audit(engine, outside, steps=1, sample_rate=0.5, expected_batch_size=8,
                        generator=g, delta=DELTA)
    with pytest.raises(ValueError, match="gradient rows"):
        engine.accumulate_gradients([torch.zeros(1, 24, 40)])
    engine.close()


# --- the f-DP analysis against the claim's GDP envelope: sigma/2 and 2q too -------------
# Sized by benchmarks/audit_power.py's power study (docs/privacy.md, "Empirical audits"):
# at q 0.25 and 20 steps, 200,000 one-hot canaries put the broken runs' bounds 12-57 %
# above the claim's envelope and the correct run's 37-51 % below it (5 repeats per cell).
GDP_Q, GDP_STEPS, GDP_CANARIES = 0.25, 20, 200_000


def _gdp_run(eps: float, *, broken: str | None, seed: int,
             device: str = "cpu") -> WhiteBoxAudit:
    sigma = calibrate_noise_multiplier(eps, GDP_Q, GDP_STEPS, DELTA)
    envelope = dp_sgd_gdp_envelope(sigma, GDP_Q, GDP_STEPS)
    torch.manual_seed(seed)
    model = nn.Linear(500, 400).to(device)  # 200,400 trainable values
    cls = PerMicroBatchNoiseEngine if broken == "noise per micro-batch" else BookKeepingEngine
    engine = cls(
        model, torch.optim.SGD(model.parameters(), lr=0.01),
        noise_multiplier=sigma / 2 if broken == "sigma/2" else sigma, max_grad_norm=CLIP,
        expected_batch_size=EXPECTED, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(2000 + seed)
    canaries = DiracCanaries.draw(200_400, GDP_CANARIES, g)
    try:
        result = white_box_audit(
            engine, canaries, steps=GDP_STEPS,
            sample_rate=2 * GDP_Q if broken == "2q" else GDP_Q,
            expected_batch_size=EXPECTED, generator=g, delta=DELTA,
            claimed_mu=envelope.mu, tail_delta=envelope.tail_delta)
        assert all(p.device.type == device and p.grad is None for p in engine.params)
        return result
    finally:
        engine.close()


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_the_gdp_analysis_catches_half_the_noise_and_twice_the_rate(eps: float) -> None:
    _catches(eps, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gdp_audit_runs_on_the_gpu() -> None:
    # the device script's audit row (scripts/device_check.sh step 2): the same run with the
    # model, the noise and the canaries' clipped sums on the GPU
    _catches(1.0, "cuda")


def _catches(eps: float, device: str) -> None:
    correct = _gdp_run(eps, broken=None, seed=10, device=device)
    assert not correct.gdp.rejected, correct.gdp
    for broken in ("sigma/2", "2q", "noise per micro-batch"):
        result = _gdp_run(eps, broken=broken, seed=11, device=device)
        assert result.gdp.rejected, (broken, result.gdp)
        assert result.gdp.mu_lower_bound > result.gdp.claimed_mu  # type: ignore[operator]


def test_one_hot_units_are_clipped_as_the_same_dense_rows() -> None:
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    sums = []
    for path in ("dense", "one_hot"):
        engine = BookKeepingEngine(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0,
                                   max_grad_norm=CLIP, expected_batch_size=1,
                                   _test_noise=ZeroNoise())
        positions = torch.tensor([3, 700, 3, 1183])
        values = torch.tensor([0.2, -4.0, 1.0, 0.49], dtype=torch.float64)
        if path == "dense":
            flat = torch.zeros(4, 1184)
            flat[torch.arange(4), positions] = values.float()
            rows = [r.reshape(-1, *p.shape) for r, p in
                    zip(torch.split(flat, [p.numel() for p in params], dim=1), params,
                        strict=True)]
            clipped = engine.accumulate_gradients(rows)
        else:
            clipped = engine.accumulate_one_hot(positions, values)
        assert clipped == 2  # |-4.0| and 1.0 are above C = 0.5
        engine.privatize()
        sums.append(torch.cat([p.grad.detach().flatten() for p in params]).clone())
        engine.discard()
        engine.close()
    torch.testing.assert_close(sums[0], sums[1])
    assert sums[0][3].item() == pytest.approx(0.2 + 0.5, abs=1e-5)  # 0.2 kept, 1.0 -> C
    assert sums[0][700].item() == pytest.approx(-0.5, abs=1e-5)
    with pytest.raises(ValueError, match="outside"):
        BookKeepingEngine(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0,
                          max_grad_norm=CLIP, expected_batch_size=1).accumulate_one_hot(
            torch.tensor([5000]), torch.tensor([1.0]))
