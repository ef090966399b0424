"""Direct DP training of an image classifier (issue 20, item 1): the finetune's mechanism
with a classifier's loss. Each image (or subject) adds at most C to the step's sum, the
engine gets the ledger's sigma, C and B verbatim, steps are leased before they run, and a
resume continues from the last checkpoint.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml.dp_train import (
    ClassifierTraining,
    build_classifier,
    dp_train_classifier,
    save_classifier,
)
from dpsynth_ml.dp_train.run import _prepare, accumulate_step, load_classifier
from dpsynth_ml.evaluation.classifiers import classifier_accuracy
from dpsynth_ml.spec import DpSpec, InvalidSpecError, RecordLevel, SubjectLevel
from torch import nn

from .dp_support import ZeroNoise
from .support import RecordingHooks, seeded, write_digits

pytestmark = pytest.mark.unit

CLIP = 0.5


def _spec(arch: str = "gn_resnet", *, q: float = 1.0, batch: int = 12, steps: int = 4,
          sigma: float = 1.0, subjects: int | None = None, **extra: object) -> ClassifierTraining:
    dp = DpSpec(noise_multiplier=sigma, sample_rate=q, expected_batch_size=batch,
                max_grad_norm=CLIP, steps=steps)
    privacy = (SubjectLevel(dp, max_images_per_subject=subjects) if subjects
               else RecordLevel(dp))
    return ClassifierTraining(architecture=arch, image_size=16, channels=1, privacy=privacy,
                              max_physical_batch_size=5, checkpoint_every=2,
                              **extra)  # type: ignore[arg-type]


@pytest.fixture()
def twelve(tmp_path: Path) -> Path:
    return write_digits(tmp_path / "twelve.npz", n=12)


def _released_sum(run: object) -> torch.Tensor:
    engine = run.engine  # type: ignore[attr-defined]
    engine.privatize()
    return torch.cat([p.grad.flatten() for p in engine.params]) * (
        run.spec.privacy.dp.expected_batch_size)  # type: ignore[attr-defined]


def _twin(run: object) -> nn.Module:
    """A plain copy of the run's model (same weights, no opacus hooks)."""
    model = run.model  # type: ignore[attr-defined]
    twin = build_classifier(model.kind, image_size=model.image_size, channels=model.channels,
                            num_classes=model.num_classes)
    twin.load_state_dict(model.state_dict())
    return twin


def _clipped(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One example's gradient (a separate backward of a copy), clipped to C."""
    copy_ = copy.deepcopy(model)
    loss = nn.functional.cross_entropy(copy_(x[None]), y[None], reduction="sum")
    grads = torch.autograd.grad(loss, [p for p in copy_.parameters()])
    flat = torch.cat([g.flatten() for g in grads])
    return flat * min(1.0, CLIP / (float(flat.norm()) + 1e-6))


def test_each_image_adds_its_own_gradient_clipped_to_c(twelve: Path, tmp_path: Path) -> None:
    """q = 1, no noise (a test-only source): the released sum is exactly the sum of the 12
    images' own gradients, each clipped to C (computed here one by one), padding adds 0."""
    run = _prepare(_spec(), dataset_path=twelve, out_dir=tmp_path, generator=seeded(1),
                   rng="test", init_model_dir=None, resume_from=None,
                   device=torch.device("cpu"), _test_noise=ZeroNoise())
    reference = _twin(run)
    stats = accumulate_step(run)
    released = _released_sum(run)
    expected = sum(_clipped(reference, run.images[i], run.labels[i]) for i in range(12))
    assert isinstance(expected, torch.Tensor)
    torch.testing.assert_close(released, expected, rtol=2e-4, atol=2e-5)
    assert stats["batch_size"] == 12 and stats["rows"] >= 12  # padded to the fixed rows
    assert float(released.norm()) <= 12 * CLIP * (1 + 1e-5)
    run.engine.close()


def test_a_subjects_images_are_one_contribution_clipped_once(tmp_path: Path) -> None:
    """Subject-level: 3 subjects of 4, 5 and 3 images, the 5-image one cut across
    micro-batches of 5 rows; each subject adds the mean of its images' gradients, clipped
    ONCE to C."""
    path = write_digits(tmp_path / "subjects.npz", n=12)
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    subjects = np.array([0] * 4 + [1] * 5 + [2] * 3, dtype=np.int64)
    np.savez(path, subjects=subjects, **arrays)
    run = _prepare(_spec(subjects=5, batch=3), dataset_path=path, out_dir=tmp_path,
                   generator=seeded(2), rng="test", init_model_dir=None, resume_from=None,
                   device=torch.device("cpu"), _test_noise=ZeroNoise())
    reference = _twin(run)
    stats = accumulate_step(run)
    released = _released_sum(run)
    expected = torch.zeros_like(released)
    for subject in range(3):
        rows = np.flatnonzero(subjects == subject)
        copy_ = copy.deepcopy(reference)
        loss = nn.functional.cross_entropy(copy_(run.images[rows]), run.labels[rows],
                                           reduction="mean")
        flat = torch.cat([g.flatten() for g in torch.autograd.grad(
            loss, list(copy_.parameters()))])
        expected += flat * min(1.0, CLIP / (float(flat.norm()) + 1e-6))
    torch.testing.assert_close(released, expected, rtol=2e-4, atol=2e-5)
    assert stats["batch_size"] == 3 and stats["images"] == 12
    run.engine.close()


def test_the_engine_gets_the_ledgers_numbers_and_steps_are_leased_first(
        tmp_path: Path) -> None:
    data = write_digits(tmp_path / "d.npz", n=60)
    spec = _spec("cnn", q=0.2, batch=12, steps=5, sigma=1.3)
    hooks = RecordingHooks(budget=3)
    result = dp_train_classifier(spec, dataset_path=data, out_dir=tmp_path / "out",
                                 hooks=hooks, generator=seeded(3), rng="test")
    # leased in chunks of checkpoint_every, before they run: 2, then 1 of 2, then none
    assert hooks.acquired == [(0, 2, 2), (2, 2, 1), (3, 2, 0)]
    assert result.steps_completed == 3 and result.stopped_early
    # a checkpoint at each chunk's end, and where it stopped (a resume continues there)
    assert [s for s, _ in hooks.checkpoints] == [2, 3]
    _, info = load_classifier(result.model_dir)
    assert info["steps"] == 3 and info["rng"] == "test" and info["architecture"] == "cnn"
    assert info["dp"] == {"noise_multiplier": 1.3, "sample_rate": 0.2,
                          "expected_batch_size": 12, "max_grad_norm": CLIP, "steps": 5}
    run = _prepare(spec, dataset_path=data, out_dir=tmp_path / "x", generator=seeded(3),
                   rng="test", init_model_dir=None, resume_from=None,
                   device=torch.device("cpu"))
    engine = run.engine.optimizer
    assert (engine.noise_multiplier, engine.max_grad_norm, engine.expected_batch_size) == (
        1.3, CLIP, 12)
    run.engine.close()


def test_a_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    data = write_digits(tmp_path / "d.npz", n=60)
    spec = _spec("cnn", q=0.2, batch=12, steps=4)
    first = RecordingHooks(stop_after=2)
    dp_train_classifier(spec, dataset_path=data, out_dir=tmp_path / "a", hooks=first,
                        generator=seeded(4), rng="test")
    (step, checkpoint), = first.checkpoints
    assert step == 2
    second = RecordingHooks()
    result = dp_train_classifier(spec, dataset_path=data, out_dir=tmp_path / "b",
                                 hooks=second, generator=seeded(5), rng="os",
                                 resume_from=checkpoint)
    assert second.acquired == [(2, 2, 2)] and result.steps_completed == 4
    # a model whose history had a test-seeded attempt stays "test"
    assert load_classifier(result.model_dir)[1]["rng"] == "test"


def test_a_gn_resnet_trains_under_opacus_and_every_parameter_moves(tmp_path: Path) -> None:
    data = write_digits(tmp_path / "d.npz", n=40)
    before = build_classifier("gn_resnet", image_size=16, channels=1, num_classes=10, seed=0)
    start = save_classifier(before, {"architecture": "gn_resnet", "image_size": 16,
                                     "channels": 1, "num_classes": 10}, tmp_path / "start")
    spec = _spec("gn_resnet", q=0.25, batch=10, steps=2)
    hooks = RecordingHooks()
    result = dp_train_classifier(spec, dataset_path=data, out_dir=tmp_path / "o",
                                 hooks=hooks, generator=seeded(6), rng="test",
                                 init_model_dir=start)
    after, _ = load_classifier(result.model_dir)
    moved = {name for (name, a), b in zip(after.state_dict().items(),
                                          before.state_dict().values(), strict=True)
             if not torch.equal(a, b)}
    assert moved == set(after.state_dict())  # GroupNorm's affine parameters too
    assert all(np.isfinite(s["loss"]) for s in hooks.private_stats if "loss" in s)


def test_a_cnn_learns_the_digits_at_a_large_epsilon(tmp_path: Path) -> None:
    """A sanity check of the whole loop (not a benchmark: docs/benchmarks.md has those)."""
    data = write_digits(tmp_path / "d.npz", n=300)
    spec = ClassifierTraining(
        architecture="cnn", image_size=8, channels=1, learning_rate=3e-3,
        privacy=RecordLevel(DpSpec(noise_multiplier=0.5, sample_rate=0.2,
                                   expected_batch_size=60, max_grad_norm=1.0, steps=40)),
        max_physical_batch_size=128, checkpoint_every=40)
    torch.manual_seed(0)
    result = dp_train_classifier(spec, dataset_path=data, out_dir=tmp_path / "o",
                                 hooks=RecordingHooks(), generator=seeded(6), rng="test")
    model, _ = load_classifier(result.model_dir)
    with np.load(data) as npz:
        images, labels = npz["images"], npz["labels"]
    accuracy = classifier_accuracy(model.eval(), images, labels)
    print("accuracy", accuracy)
    assert accuracy > 0.5  # chance is 0.1


def test_an_init_model_must_match_the_job(tmp_path: Path) -> None:
    data = write_digits(tmp_path / "d.npz", n=20)
    cnn = build_classifier("cnn", image_size=16, channels=1, num_classes=10, seed=0)
    folder = save_classifier(cnn, {"architecture": "cnn", "image_size": 16, "channels": 1,
                                   "num_classes": 10}, tmp_path / "public")
    with pytest.raises(InvalidSpecError, match="differ"):
        _prepare(_spec("gn_resnet"), dataset_path=data, out_dir=tmp_path / "o",
                 generator=seeded(7), rng="test", init_model_dir=folder, resume_from=None,
                 device=torch.device("cpu"))
    with pytest.raises(InvalidSpecError, match="unknown architecture"):
        _spec("resnet152")


# --- the audit of dp_train (issue 20: "its lower bound below the claim, a broken variant
# caught"; issue 19's white-box one-run audit through the job's own steps) ---------------

def _audit(tmp_path: Path, *, sigma: float, claimed_sigma: float,
           broken_noise: bool = False) -> tuple[float, object]:
    from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
    from dpsynth_ledger.accounting.pld import dp_sgd_epsilon
    from dpsynth_ml.audit.dp_train import audit_dp_train

    q, steps = 0.2, 8
    data = write_digits(tmp_path / "stand-in.npz", n=60)
    spec = ClassifierTraining(
        architecture="cnn", image_size=8, channels=1,
        privacy=RecordLevel(DpSpec(noise_multiplier=sigma, sample_rate=q,
                                   expected_batch_size=12, max_grad_norm=1.0, steps=steps)),
        max_physical_batch_size=64, checkpoint_every=steps)
    envelope = dp_sgd_gdp_envelope(claimed_sigma, q, steps)
    result = audit_dp_train(spec, dataset_path=data, canaries=500, delta=1e-5,
                            generator=seeded(8), claimed_mu=envelope.mu,
                            tail_delta=envelope.tail_delta,
                            _test_noise=ZeroNoise() if broken_noise else None)
    return dp_sgd_epsilon(claimed_sigma, q, steps, 1e-5), result


def test_the_audit_of_dp_train_stays_below_its_claim_and_catches_broken_noise(
        tmp_path: Path) -> None:
    from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier

    sigma = calibrate_noise_multiplier(1.0, 0.2, 8, 1e-5)
    claimed, right = _audit(tmp_path, sigma=sigma, claimed_sigma=sigma)
    assert right.bound.epsilon_lower_bound <= claimed  # type: ignore[attr-defined]
    assert not right.gdp.rejected and right.steps == 8  # type: ignore[attr-defined]
    # the run's noise a tenth of the claim's, and no noise at all: both rejected
    for broken in (_audit(tmp_path, sigma=sigma / 10, claimed_sigma=sigma)[1],
                   _audit(tmp_path, sigma=sigma, claimed_sigma=sigma, broken_noise=True)[1]):
        assert broken.gdp.rejected  # type: ignore[attr-defined]
        assert broken.bound.epsilon_lower_bound > claimed  # type: ignore[attr-defined]
