"""Recording subclasses of the real DP engines and sampler, patched into the trainer.

They run the real code and only record what it did: the Poisson batches, the released
gradients and the Gaussian noise of every logical step, per instance (one per class run).
Both clipping engines are recorded (the finetune chooses one, ``dp.choose_engine``); their
instances go to the one list ``RecordingEngine.instances``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from dpsynth_ml.dp import BookKeepingEngine, DpSgdEngine, PoissonSampler
from dpsynth_ml.training.finetune import setup as ft_setup


class RecordingSampler(PoissonSampler):
    """The real Poisson sampler, recording each batch."""

    instances: ClassVar[list[RecordingSampler]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batches: list[torch.Tensor] = []
        RecordingSampler.instances.append(self)

    def sample(self) -> torch.Tensor:
        batch = super().sample()
        self.batches.append(batch.clone())
        return batch


class RecordingEngine(DpSgdEngine):
    """The real hooks engine, recording each step's released gradient, noise and learning
    rate."""

    instances: ClassVar[list[Any]] = []  # both engines' recorders

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.released: list[torch.Tensor] = []
        self.noise: list[torch.Tensor] = []
        self.learning_rates: list[float] = []
        self.raw_after_step: list[list[torch.Tensor]] = []
        RecordingEngine.instances.append(self)

    def privatize(self) -> None:
        super().privatize()
        expected = self.optimizer.expected_batch_size
        grads = [p.grad.detach().flatten().clone() for p in self.params]
        # p.grad = (clipped sum + noise) / B_expected, and p.summed_grad is the clipped sum.
        noise = [g * expected - p.summed_grad.detach().flatten()
                 for g, p in zip(grads, self.params, strict=True)]
        self.released.append(torch.cat(grads))
        self.noise.append(torch.cat(noise))

    def apply_update(self) -> None:
        self.learning_rates.append(float(self.optimizer.original_optimizer.param_groups[0]["lr"]))
        super().apply_update()
        self.raw_after_step.append([p.detach().clone() for p in self.params])


class RecordingBookKeepingEngine(BookKeepingEngine):
    """The real book-keeping engine, recording what :class:`RecordingEngine` records."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.released: list[torch.Tensor] = []
        self.noise: list[torch.Tensor] = []
        self.learning_rates: list[float] = []
        self.raw_after_step: list[list[torch.Tensor]] = []
        self._step_noise: list[torch.Tensor] = []
        RecordingEngine.instances.append(self)

    def _release(self, sums: list[torch.Tensor]) -> list[torch.Tensor]:
        noised = super()._release(sums)
        # the noise of this step, in the units of the clipped sum (as the hooks recorder's)
        self._step_noise = [(n - s).detach().flatten() for n, s in zip(noised, sums,
                                                                        strict=True)]
        return noised

    def privatize(self) -> None:
        super().privatize()
        self.released.append(torch.cat([p.grad.detach().flatten().clone()  # type: ignore[union-attr]
                                        for p in self.params]))
        self.noise.append(torch.cat(self._step_noise))

    def apply_update(self) -> None:
        self.learning_rates.append(float(self.original_optimizer.param_groups[0]["lr"]))
        super().apply_update()
        self.raw_after_step.append([p.detach().clone() for p in self.params])


@pytest.fixture()
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Patch the recording engines and sampler into the trainer."""
    RecordingEngine.instances, RecordingSampler.instances = [], []
    monkeypatch.setattr(ft_setup, "DpSgdEngine", RecordingEngine)
    monkeypatch.setattr(ft_setup, "BookKeepingEngine", RecordingBookKeepingEngine)
    monkeypatch.setattr(ft_setup, "PoissonSampler", RecordingSampler)
    yield


class KeyedDraws:
    """A diffusion loss whose (timestep, noise) draws are a function of the example alone.

    The k-th draw of an example (identified by its latent's bytes) is the same whichever
    micro-batch it lands in, so split and unsplit steps can be compared exactly.
    """

    def __init__(self) -> None:
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.rows = 0

    def __call__(self, denoiser, scheduler, latents, labels, generator,  # type: ignore[no-untyped-def]
                 layout=None, timesteps="uniform"):
        assert timesteps == "uniform", "the keyed draws are uniform timesteps"
        timesteps, noise = [], []
        for row in latents:
            key = hashlib.sha256(row.detach().numpy().tobytes()).hexdigest()
            k = self.counts[key]
            self.counts[key] += 1
            g = torch.Generator().manual_seed(int(key[:12], 16) * 1009 + k)
            timesteps.append(torch.randint(0, 1000, (1,), generator=g))
            noise.append(torch.randn(row.shape, generator=g))
        self.rows += len(latents)
        t, eps = torch.cat(timesteps), torch.stack(noise)
        noisy = scheduler.add_noise(latents, eps, t)
        return (denoiser(noisy, t, labels, layout=layout) - eps).pow(2).flatten(1).mean(dim=1)
