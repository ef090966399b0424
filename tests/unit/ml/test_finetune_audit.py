"""The white-box audit run through a finetune's own code (issue 19, items 1, 4 and 5).

``audit_finetune`` builds the run as ``train`` would (base model, trainable set, engine,
sampler, padding, noise multiplicity, EMA) on a public stand-in, adds the gradient canaries
between each step's clipped sum and its noise, and returns only the bound: its model is
never written anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier, dp_sgd_epsilon
from dpsynth_ml import (
    InvalidSpecError,
    TrainingResult,
    audit_finetune,
    black_box_audit_finetune,
)
from dpsynth_ml.spec import CentralImages, PerLabel, RecordLevel
from dpsynth_shared.central_images import central_image_bound

from .support import finetune_spec, seeded, write_digits

pytestmark = pytest.mark.unit

DELTA = 1e-5
Q, STEPS, EXPECTED = 0.16, 20, 16


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The audit's temporary folders go here, so the test can see they are gone."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("options", [{}, {"noise_multiplicity": 2, "ema_decay": 0.9,
                                          "warmup_steps": 3}])
def test_a_finetune_audit_stays_below_its_claim_and_keeps_nothing(
        options: dict[str, object], digits_path: Path, pretrained: TrainingResult,
        private_tmp: Path) -> None:
    sigma = calibrate_noise_multiplier(1.0, Q, STEPS, DELTA)
    claimed = dp_sgd_epsilon(sigma, Q, STEPS, DELTA)
    spec = finetune_spec(dp_noise_multiplier=sigma, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=STEPS, **options)
    before = _tree_hash(pretrained.model_dir)
    result = audit_finetune(spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                            canaries=500, delta=DELTA, generator=seeded(5))
    assert result.bound.epsilon_lower_bound <= claimed
    assert result.bound.canaries == 500 and result.steps == STEPS
    assert result.presences > 0 and np.isfinite(result.scores).all()
    # nothing of the audit's model is left anywhere: the base model is untouched and the
    # work folder is gone
    assert _tree_hash(pretrained.model_dir) == before
    assert list(private_tmp.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_finetune_audit_runs_on_the_gpu(digits_path: Path, pretrained: TrainingResult,
                                          private_tmp: Path) -> None:
    """A finetune that ran on a GPU is audited on one: the run placed on CUDA (model,
    stand-in, per-example gradients, canaries and noise there), the bound on the CPU."""
    sigma = calibrate_noise_multiplier(1.0, Q, STEPS, DELTA)
    claimed = dp_sgd_epsilon(sigma, Q, STEPS, DELTA)
    spec = finetune_spec(dp_noise_multiplier=sigma, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=STEPS)
    result = audit_finetune(spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                            canaries=500, delta=DELTA, generator=seeded(5), device="cuda")
    assert result.bound.epsilon_lower_bound <= claimed and result.steps == STEPS
    assert np.isfinite(result.scores).all()
    assert list(private_tmp.iterdir()) == []


def test_an_audit_placed_on_the_cpu_replays_the_default_one(
        digits_path: Path, pretrained: TrainingResult) -> None:
    """``device="cpu"`` is the default placement: the same seeded run, the same scores."""
    spec = finetune_spec(dp_noise_multiplier=2.0, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=3)
    runs = [audit_finetune(spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                           canaries=100, delta=DELTA, generator=seeded(7), seeded_noise=True,
                           **placement)
            for placement in ({}, {"device": "cpu"})]
    assert np.array_equal(runs[0].scores, runs[1].scores)


def test_a_seeded_audit_replays_and_a_user_level_one_runs(
        digits_path: Path, pretrained: TrainingResult, tmp_path: Path) -> None:
    spec = finetune_spec(dp_noise_multiplier=2.0, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=5)
    runs = [audit_finetune(spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                           canaries=200, delta=DELTA, generator=seeded(6), seeded_noise=True)
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0].scores, runs[1].scores)
    # user-level DP-SGD: the canaries are extra subjects
    path = write_digits(tmp_path / "subjects.npz")
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["subjects"] = np.arange(arrays["images"].shape[0]) % 30
    np.savez(path, **arrays)
    subject = finetune_spec(privacy_unit="subject", max_images_per_subject=3,
                            max_physical_batch_size=4, dp_sample_rate=4 / 30,
                            dp_expected_batch_size=4, dp_steps=3, dp_noise_multiplier=2.0)
    result = audit_finetune(subject, dataset_path=path, base_model_dir=pretrained.model_dir,
                            canaries=100, delta=DELTA, generator=seeded(7))
    assert result.steps == 3 and result.bound.canaries == 100


def test_what_the_audit_does_not_cover_is_refused(digits_path: Path,
                                                  pretrained: TrainingResult) -> None:
    spec = finetune_spec(central_images=CentralImages(
        noise_std=1.0, bound=central_image_bound(16, 1, 2),
        class_sizes={f"digit {i}": 20 for i in range(10)}, downsample=2))
    with pytest.raises(InvalidSpecError, match="central_images"):
        audit_finetune(spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                       canaries=10, delta=DELTA, generator=seeded(8))
    with pytest.raises(ValueError, match="coordinates"):
        audit_finetune(finetune_spec(), dataset_path=digits_path,
                       base_model_dir=pretrained.model_dir, canaries=10**9, delta=DELTA,
                       generator=seeded(9))


def test_a_per_label_finetune_is_audited_one_class_run_at_a_time(
        digits_path: Path, pretrained: TrainingResult) -> None:
    whole = finetune_spec(dp_noise_multiplier=2.0, dp_sample_rate=0.5,
                          dp_expected_batch_size=4, dp_steps=4)
    assert isinstance(whole.privacy, RecordLevel)
    runs = {f"digit {i}": RecordLevel(dataclasses.replace(whole.privacy.dp, steps=3 + i % 2))
            for i in range(10)}
    per_label = dataclasses.replace(whole, privacy=PerLabel(runs))
    # digit 3's run: its own DpSpec (4 steps), on the stand-in's records labelled 3 only
    result = audit_finetune(per_label, dataset_path=digits_path,
                            base_model_dir=pretrained.model_dir, canaries=100, delta=DELTA,
                            generator=seeded(10), audited_class="digit 3")
    assert result.steps == 4 and result.sample_rate == 0.5 and result.bound.canaries == 100
    with pytest.raises(InvalidSpecError, match="audited_class"):
        audit_finetune(per_label, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                       canaries=10, delta=DELTA, generator=seeded(11))
    with pytest.raises(InvalidSpecError, match="not a class"):
        audit_finetune(per_label, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                       canaries=10, delta=DELTA, generator=seeded(11), audited_class="cat")
    with pytest.raises(InvalidSpecError, match="per-label"):
        audit_finetune(whole, dataset_path=digits_path, base_model_dir=pretrained.model_dir,
                       canaries=10, delta=DELTA, generator=seeded(11), audited_class="digit 3")


def test_a_black_box_audit_scores_loss_canaries_on_the_released_model(
        digits_path: Path, pretrained: TrainingResult, private_tmp: Path) -> None:
    sigma = calibrate_noise_multiplier(1.0, Q, 10, DELTA)
    claimed = dp_sgd_epsilon(sigma, Q, 10, DELTA)
    spec = finetune_spec(dp_noise_multiplier=sigma, dp_sample_rate=Q,
                         dp_expected_batch_size=EXPECTED, dp_steps=10)
    before = _tree_hash(pretrained.model_dir)
    result = black_box_audit_finetune(
        spec, dataset_path=digits_path, base_model_dir=pretrained.model_dir, canaries=40,
        delta=DELTA, generator=seeded(12), draws=4)
    # N̂ = 16 / 0.16 = 100: 60 stand-in records beside the canaries drawn in
    assert result.stand_in_records == 60 and 0 < result.included < 40
    assert result.bound.canaries == 40 and result.steps == 10
    assert np.isfinite(result.scores).all() and result.scores.shape == (40,)
    assert result.bound.epsilon_lower_bound <= claimed  # valid for any score
    assert result.bound.max_certifiable < 2  # 40 canaries can say little (1.95), and say so
    assert _tree_hash(pretrained.model_dir) == before
    assert list(private_tmp.iterdir()) == []  # the audit's model is gone
    with pytest.raises(InvalidSpecError, match="at most 50"):
        black_box_audit_finetune(spec, dataset_path=digits_path,
                                 base_model_dir=pretrained.model_dir, canaries=51,
                                 delta=DELTA, generator=seeded(13))
    # subject-level runs: the canaries are subjects, at most half of N̂ subjects
    # (tests/unit/ml/test_black_box_subject_audit.py)
    subject = finetune_spec(privacy_unit="subject", dp_sample_rate=Q,
                            dp_expected_batch_size=EXPECTED, dp_steps=2)
    with pytest.raises(InvalidSpecError, match="N̂ = 100 subjects: at most 50"):
        black_box_audit_finetune(subject, dataset_path=digits_path,
                                 base_model_dir=pretrained.model_dir, canaries=51,
                                 delta=DELTA, generator=seeded(14))
