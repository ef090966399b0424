"""Pixel-space sampling holds each step's clean-image estimate to the data range."""

from __future__ import annotations

from dpsynth_ml.models.architectures import build_scheduler


def test_pixel_samplers_hold_the_clean_estimate_to_the_data_range() -> None:
    """A pixel model's samplers clip (DDPM, DDIM) or threshold (DPM-Solver++) each step's
    estimate of the clean image to [-1, 1]; a latent model's never do."""
    from types import SimpleNamespace

    from dpsynth_ml.sampling.denoise import make_scheduler

    bundle = SimpleNamespace(scheduler=build_scheduler())
    for kind in ("ddpm", "ddim"):
        pixel = make_scheduler(bundle, kind, 10, pixel=True)  # type: ignore[arg-type]
        latent = make_scheduler(bundle, kind, 10)  # type: ignore[arg-type]
        assert pixel.config.clip_sample is True and pixel.config.clip_sample_range == 1.0
        assert latent.config.clip_sample is False
    solver = make_scheduler(bundle, "dpm_solver++", 10, pixel=True)  # type: ignore[arg-type]
    assert solver.config.thresholding is True and solver.config.sample_max_value == 1.0
    assert make_scheduler(bundle, "dpm_solver++", 10).config.thresholding is False  # type: ignore[arg-type]
