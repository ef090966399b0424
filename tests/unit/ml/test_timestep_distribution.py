"""Training timesteps: uniform (unchanged draws) or EDM's log-normal noise level."""

from __future__ import annotations

import math

import torch
from dpsynth_ml import InvalidSpecError, PretrainTraining
from dpsynth_ml.models.architectures import build_scheduler
from dpsynth_ml.training.diffusion import (
    EDM_P_MEAN,
    EDM_P_STD,
    draw_timesteps,
    edm_timestep_mass,
)


def test_uniform_draws_are_the_plain_randint_draws() -> None:
    scheduler = build_scheduler()
    a = draw_timesteps(scheduler, 64, torch.Generator().manual_seed(3))
    b = torch.randint(0, int(scheduler.config["num_train_timesteps"]), (64,),
                      generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)  # models trained before the option exist draw the same steps


def test_edm_log_normal_matches_its_closed_form() -> None:
    scheduler = build_scheduler()
    n = 200_000
    t = draw_timesteps(scheduler, n, torch.Generator().manual_seed(0), "edm_log_normal")
    num_t = int(scheduler.config["num_train_timesteps"])
    assert t.dtype == torch.int64 and int(t.min()) >= 0 and int(t.max()) < num_t
    mass = edm_timestep_mass(scheduler)
    assert math.isclose(float(mass.sum()), 1.0, rel_tol=1e-9)
    counts = torch.bincount(t, minlength=num_t).to(torch.float64)
    # total variation between the empirical and the closed-form distribution, over bins
    # of 25 steps (per step, 200k draws over 1,000 cells leave ~0.02 of sampling noise)
    binned = (counts / n - mass).reshape(-1, 25).sum(dim=1)
    assert float(binned.abs().sum()) / 2 < 0.01
    # the median noise level is exp(p_mean): log σ of the median step is near -1.2
    alphas = scheduler.alphas_cumprod.to(torch.float64)
    log_sigma = 0.5 * torch.log((1 - alphas) / alphas)
    assert abs(float(log_sigma[t].median()) - EDM_P_MEAN) < 0.05
    assert abs(float(log_sigma[t].std()) - EDM_P_STD) < 0.25  # clipped at both ends


def test_unknown_distribution_is_refused() -> None:
    try:
        PretrainTraining(timestep_distribution="cosine")  # type: ignore[arg-type]
    except InvalidSpecError:
        return
    raise AssertionError("an unknown timestep distribution was accepted")

