"""Black-box audits of layout models (DP-DocLDM; issue 19, item 5): each canary image has
a random binary layout mask of its own. A layout-conditioned model is scored on the canary
image given its mask; a layout generator (``target: masks``) on the mask itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier, dp_sgd_epsilon
from dpsynth_ml import (
    PretrainTraining,
    TrainingResult,
    audit_finetune,
    black_box_audit_finetune,
    train,
)
from dpsynth_ml.audit import blackbox
from dpsynth_ml.audit.canary_sets import draw_canaries, record_training_set
from dpsynth_ml.data import ImageDataset

from .support import IMAGE_SIZE, finetune_spec, seeded, write_digits
from .test_layout import _line_masks

pytestmark = pytest.mark.unit

DELTA = 1e-5
Q, EXPECTED, STEPS, N = 0.2, 8, 4, 40  # N̂ = 40 records


@pytest.fixture(scope="module")
def masked_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bb-layout")
    with np.load(write_digits(root / "plain.npz", n=N)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    path = root / "masked.npz"
    np.savez(path, masks=_line_masks(N), **arrays)
    return path


def _pretrain(data: Path, out: Path, **kind: Any) -> TrainingResult:
    spec = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1, batch_size=20,
                            learning_rate=1e-3, **kind)
    return train(spec, dataset_path=data, out_dir=out)


def test_canary_images_carry_random_masks_into_the_training_set() -> None:
    rng = np.random.default_rng(0)
    data = ImageDataset(images=rng.integers(0, 256, (20, 8, 8, 1), dtype=np.uint8),
                        labels=np.arange(20, dtype=np.int64) % 2, class_names=("a", "b"),
                        masks=_line_masks(20, size=8))
    canaries = draw_canaries(data, 6, rng, None)
    assert canaries.masks is not None and canaries.masks.shape == (6, 8, 8, 1)
    assert set(np.unique(canaries.masks).tolist()) == {0, 255}  # binary, and random:
    assert 0.3 < float((canaries.masks == 255).mean()) < 0.7  # unlike a page's text lines
    included = np.array([True, False, True, False, False, True])
    made = record_training_set(data, canaries, included, population=16, rng=rng)
    train_set = made.dataset
    assert train_set.masks is not None and len(train_set.masks) == len(train_set) == 10 + 3
    assert np.array_equal(train_set.masks[10:], canaries.masks[included])
    assert np.array_equal(train_set.images[10:], canaries.images[included])


@pytest.mark.parametrize("kind", [{"layout_conditioning": True}, {"target": "masks"}])
def test_a_black_box_audit_of_a_layout_model_scores_its_canaries(
        kind: dict[str, Any], masked_digits: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = _pretrain(masked_digits, tmp_path / "base", **kind)
    sigma = calibrate_noise_multiplier(1.0, Q, STEPS, DELTA)
    target = {"target": "masks"} if "target" in kind else {}
    spec = finetune_spec(dp_noise_multiplier=sigma, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=STEPS, **target)
    scored: list[Any] = []
    real = blackbox.per_sample_diffusion_loss

    def spy(*args: Any, **kwargs: Any) -> Any:
        scored.append(kwargs.get("layout"))
        return real(*args, **kwargs)

    monkeypatch.setattr(blackbox, "per_sample_diffusion_loss", spy)
    result = black_box_audit_finetune(
        spec, dataset_path=masked_digits, base_model_dir=base.model_dir, canaries=12,
        delta=DELTA, generator=seeded(4), draws=2)
    assert result.stand_in_records == N - 12 and 0 < result.included < 12
    assert np.isfinite(result.scores).all() and result.scores.shape == (12,)
    assert result.bound.epsilon_lower_bound <= dp_sgd_epsilon(sigma, Q, STEPS, DELTA)
    # conditioned: scored given each canary's own mask; a generator: no layout input
    assert scored and all((layout is not None) == ("layout_conditioning" in kind)
                          for layout in scored)


@pytest.mark.parametrize("kind", [{"layout_conditioning": True}, {"target": "masks"}])
def test_a_white_box_audit_runs_through_a_layout_finetune(
        kind: dict[str, Any], masked_digits: Path, tmp_path: Path) -> None:
    """The white-box audit covers the same two layout paths (its canaries are gradients:
    no mask needed; the stand-in's records carry theirs through the finetune's steps)."""
    base = _pretrain(masked_digits, tmp_path / "base", **kind)
    sigma = calibrate_noise_multiplier(1.0, Q, STEPS, DELTA)
    target = {"target": "masks"} if "target" in kind else {}
    spec = finetune_spec(dp_noise_multiplier=sigma, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=STEPS, **target)
    result = audit_finetune(spec, dataset_path=masked_digits, base_model_dir=base.model_dir,
                            canaries=200, delta=DELTA, generator=seeded(5))
    assert result.steps == STEPS and result.presences > 0
    assert result.bound.epsilon_lower_bound <= dp_sgd_epsilon(sigma, Q, STEPS, DELTA)
