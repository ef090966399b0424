"""Draws made where the model trains (issue 18, item 1): the central-image warm-up's batches
(:class:`dpsynth_ml.warmup.release.ReleasedBatches`) and the diffusion noise
(:func:`dpsynth_ml.training.diffusion.standard_normal_like`). On the CPU both are bit for bit
what the host-side code drew before; on a GPU (skipped without CUDA) they are drawn there,
as a function of the CPU job generator's state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dpsynth_ml.training.diffusion import standard_normal_like
from dpsynth_ml.warmup.release import (
    CentralRelease,
    ReleasedBatches,
    postprocess,
    sample_released,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _release(second_moments: bool, seed: int = 0) -> CentralRelease:
    rng = np.random.default_rng(seed)
    queries, classes, h, k = 2, 3, 7, 4
    means = rng.normal(0.0, 0.2, size=(queries, classes, h, h, 1))
    images = postprocess(means.reshape(-1, h, h, 1), image_size=14)
    components = (rng.normal(0.0, 0.05, size=(queries * classes, k, h, h, 1))
                  .astype(np.float32) if second_moments else None)
    return CentralRelease(images=images, labels=np.tile(np.arange(classes), queries),
                          means=means, components=components)


def _host_reference(release: CentralRelease, index: torch.Tensor,
                    generator: torch.Generator, size: int) -> torch.Tensor:
    """The host-side draw the warm-up made before its batches moved to the device."""
    if release.components is None:
        chosen = torch.from_numpy(np.ascontiguousarray(release.images[index.numpy()]))
        return chosen.permute(0, 3, 1, 2).float()
    means = release.means.reshape(-1, *release.means.shape[2:])
    idx = index.numpy()
    comps = torch.from_numpy(release.components[idx]).double()
    z = torch.randn(len(idx), comps.shape[1], generator=generator, dtype=torch.float64)
    draws = torch.from_numpy(means[idx]) + torch.einsum("nk,nkhwc->nhwc", z, comps)
    return torch.from_numpy(postprocess(draws.numpy(), image_size=size)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("second_moments", [False, True])
def test_warmup_batches_on_the_cpu_are_the_host_draws_bit_for_bit(
        second_moments: bool) -> None:
    release = _release(second_moments)
    index = torch.tensor([0, 5, 5, 2, 3])
    batches = ReleasedBatches(release, image_size=14)
    got = [batches(index, torch.Generator().manual_seed(7)) for _ in range(2)]
    want = _host_reference(release, index, torch.Generator().manual_seed(7), 14)
    assert got[0].shape == (5, 1, 14, 14) and got[0].dtype == torch.float32
    assert torch.equal(got[0], want) and torch.equal(got[1], want)
    assert torch.equal(sample_released(release, index, torch.Generator().manual_seed(7),
                                       image_size=14), want)


def test_the_diffusion_noise_on_the_cpu_is_the_generators_own_draw() -> None:
    like = torch.zeros(3, 2, 5, 5)
    got = standard_normal_like(like, torch.Generator().manual_seed(11))
    assert torch.equal(got, torch.randn(like.shape, generator=torch.Generator().manual_seed(11)))
    assert got.dtype == torch.float32 and got.device == like.device


@needs_cuda
@pytest.mark.parametrize("second_moments", [False, True])
def test_warmup_batches_are_drawn_on_the_gpu(second_moments: bool) -> None:
    release = _release(second_moments)
    index = torch.tensor([0, 5, 5, 2, 3])
    got = ReleasedBatches(release, image_size=14, device="cuda:0")(
        index, torch.Generator().manual_seed(7))
    want = _host_reference(release, index, torch.Generator().manual_seed(7), 14)
    assert got.is_cuda
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-5)


@needs_cuda
def test_the_diffusion_noise_is_drawn_on_the_gpu_from_the_job_generators_state() -> None:
    like = torch.zeros(64, 1, 28, 28, device="cuda:0")
    first = standard_normal_like(like, torch.Generator().manual_seed(3))
    again = standard_normal_like(like, torch.Generator().manual_seed(3))
    other = standard_normal_like(like, torch.Generator().manual_seed(4))
    assert first.is_cuda and first.dtype == torch.float32 and first.shape == like.shape
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert abs(float(first.mean())) < 0.05 and abs(float(first.std()) - 1.0) < 0.05
    # the job generator moved by exactly one 64-bit draw (the device generator's seed)
    g, ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    standard_normal_like(like, g)
    torch.randint(0, 2**63 - 1, (1,), generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())
