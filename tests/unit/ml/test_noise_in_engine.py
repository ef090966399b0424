"""The DP-SGD engines draw their noise from the ChaCha20 source, never from torch.normal.

Production engines (no injected generator) get a fresh OS key each; an injected test
generator keys the same ChaCha20 code reproducibly (docs/privacy.md, "The noise source").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.dp import BookKeepingEngine, DpSgdEngine
from dpsynth_ml.dp.distributed import DistributedDpSgdEngine
from dpsynth_ml.dp.noise import ChaChaGaussian
from dpsynth_ml.training.finetune import setup as ft_setup
from torch import nn

from .support import finetune_spec, seeded

SIGMA, CLIP, EXPECTED = 0.9, 0.6, 8
CPU = torch.device("cpu")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GroupNorm(2, 16), nn.SiLU(), nn.Linear(16, 4))


def _engine(cls: type[DpSgdEngine] = DpSgdEngine, **kwargs: Any) -> DpSgdEngine:
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    return cls(model, torch.optim.SGD(params, lr=0.1), noise_multiplier=SIGMA,
               max_grad_norm=CLIP, expected_batch_size=EXPECTED, **kwargs)


def _pure_noise(engine: DpSgdEngine) -> torch.Tensor:
    """One logical step on an empty batch: the released sum is the noise alone."""
    engine.privatize()
    noise = torch.cat([p.grad.detach().flatten() for p in engine.params]) * EXPECTED
    engine.discard()
    return noise


@pytest.fixture()
def no_torch_normal(monkeypatch: pytest.MonkeyPatch) -> None:
    """opacus' non-secure noise is ``torch.normal`` on a (Mersenne-Twister) generator."""
    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("DP noise drawn with torch.normal")

    monkeypatch.setattr(torch, "normal", refuse)


def test_a_production_engine_never_uses_torch_normal_and_has_calibrated_noise(
        no_torch_normal: None) -> None:
    engine = _engine()  # no generator: production
    assert isinstance(engine.noise_source, ChaChaGaussian)
    assert engine.noise_source.kind == "os"
    noise = torch.stack([_pure_noise(engine) for _ in range(150)]).double()
    n, target = noise.numel(), SIGMA * CLIP
    assert abs(noise.std().item() - target) < 5 * target / math.sqrt(2 * (n - 1))
    assert abs(noise.mean().item()) < 5 * target / math.sqrt(n)
    assert not torch.equal(noise[0], noise[1])  # fresh draws each step
    # another engine (another attempt) has another key
    other = _pure_noise(_engine())
    assert not torch.isin(other, noise[0]).any()


def test_the_engine_noise_is_the_sources_values(no_torch_normal: None) -> None:
    engine = _engine(generator=seeded(9))
    assert engine.noise_source.kind == "test"
    got = _pure_noise(engine)
    # one draw for all parameters (same device and dtype), split in parameter order
    expected = ChaChaGaussian.keyed_by(seeded(9)).gaussian((got.numel(),), SIGMA * CLIP,
                                                           device=CPU, dtype=torch.float32)
    # privatize divides by E, the test multiplies back: float32 rounding only
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


@pytest.fixture()
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A single-process gloo group (world size 1) in this process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_distributed_engine_noises_from_its_source(no_torch_normal: None,
                                                       one_rank_group: None) -> None:
    production = _engine(DistributedDpSgdEngine)
    assert production.noise_source.kind == "os"
    assert _pure_noise(production).abs().sum() > 0
    production.close()
    engine = _engine(DistributedDpSgdEngine, generator=seeded(11))
    got = _pure_noise(engine)
    expected = ChaChaGaussian.keyed_by(seeded(11)).gaussian((got.numel(),), SIGMA * CLIP,
                                                            device=CPU, dtype=torch.float32)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


# the finetune runner picks the key ---------------------------------------------------------

class KeyRecordingEngine(DpSgdEngine):
    instances: ClassVar[list[Any]] = []  # both engines' instances

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        KeyRecordingEngine.instances.append(self)


class KeyRecordingBookKeepingEngine(BookKeepingEngine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        KeyRecordingEngine.instances.append(self)


@pytest.fixture()
def recording(monkeypatch: pytest.MonkeyPatch) -> type[KeyRecordingEngine]:
    KeyRecordingEngine.instances = []
    monkeypatch.setattr(ft_setup, "DpSgdEngine", KeyRecordingEngine)
    monkeypatch.setattr(ft_setup, "BookKeepingEngine", KeyRecordingBookKeepingEngine)
    return KeyRecordingEngine


def test_a_production_finetune_keys_its_noise_from_the_os_and_a_test_one_from_its_generator(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        recording: type[KeyRecordingEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = finetune_spec(dp_steps=2, checkpoint_every=1, dp_sample_rate=0.1)
    tested = train(spec, dataset_path=digits_path, out_dir=tmp_path / "t",
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    assert tested.rng == "test"
    with monkeypatch.context() as patch:
        patch.setattr(torch, "normal", _refuse_normal)
        production = train(spec, dataset_path=digits_path, out_dir=tmp_path / "p",
                           base_model_dir=pretrained.model_dir)
        # an OS-seeded attempt resuming a test-stamped run: stamped test, OS-keyed noise
        resumed = train(spec, dataset_path=digits_path, out_dir=tmp_path / "t",
                        resume_from=tmp_path / "t" / "checkpoints" / "step-0000001")
    assert production.rng == "os" and resumed.rng == "test"
    kinds = [engine.noise_source.kind for engine in recording.instances]
    assert kinds == ["test", "os", "os"]


def _refuse_normal(*args: object, **kwargs: object) -> torch.Tensor:
    raise AssertionError("DP noise drawn with torch.normal")
