"""An untrained pixel-space model (the base of a finetune with no public pretraining)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dpsynth_ml import InvalidSpecError, PretrainTraining, initial_model, read_model_info
from dpsynth_ml.models.model_io import load_model

NAMES = ("a", "b", "c")


def _spec(**kw: object) -> PretrainTraining:
    base: dict[str, object] = {"preset": "tiny", "space": "pixel", "image_size": 16,
                               "num_classes": 3, "seed": 7}
    return PretrainTraining(**{**base, **kw})  # type: ignore[arg-type]


def test_initial_model_is_seeded_pixel_and_loadable(tmp_path: Path) -> None:
    one = initial_model(_spec(), NAMES, tmp_path / "one")
    two = initial_model(_spec(), NAMES, tmp_path / "two")
    info = read_model_info(one)
    assert info.space == "pixel" and info.steps == 0 and info.class_names == NAMES
    assert info.extra["initialised_only"] is True and not (one / "vae").exists()
    a, _ = load_model(one)
    b, _ = load_model(two)
    for (name, p), (_, q) in zip(a.unet.state_dict().items(), b.unet.state_dict().items(),
                                 strict=True):
        assert torch.equal(p, q), name  # the same seed, the same weights
    c, _ = load_model(initial_model(_spec(seed=8), NAMES, tmp_path / "three"))
    assert any(not torch.equal(p, q) for p, q in zip(a.unet.state_dict().values(),
                                                     c.unet.state_dict().values(), strict=True))


@pytest.mark.parametrize("kw,names", [({"space": "latent"}, NAMES),
                                      ({"layout_conditioning": True}, NAMES),
                                      ({}, ("a", "b")), ({}, ("a", "a", "b"))])
def test_initial_model_refusals(tmp_path: Path, kw: dict[str, object],
                                names: tuple[str, ...]) -> None:
    with pytest.raises(InvalidSpecError):
        initial_model(_spec(**kw), names, tmp_path)
