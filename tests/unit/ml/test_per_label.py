"""Per-label training (DP-DocLDM): one DP denoiser per class, each on its class only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from dpsynth_ml import (
    DpSpec,
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    RecordLevel,
    TrainingResult,
    train,
)
from dpsynth_ml.models.model_io import (
    load_model_denoiser,
    load_per_label_denoisers,
    read_model_info,
)
from dpsynth_ml.training.finetune import loop as ft_loop
from dpsynth_ml.training.finetune import setup as ft_setup
from safetensors.torch import load_file

from .dp_support import one_thread
from .recording import RecordingSampler, recording
from .support import IMAGE_SIZE, RecordingHooks, seeded

pytestmark = pytest.mark.usefixtures("one_thread", "recording")
__all__ = ["one_thread", "recording"]

CLASSES = ("zero", "one", "two")
STEPS = {"zero": 3, "one": 3, "two": 2}
RATES = {"zero": 0.3, "one": 0.25, "two": 0.4}


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits 0, 1, 2 of sklearn's set (distinct images per class), as a 3-class dataset."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.flatnonzero(digits.target < 3)[:36]
    images = (digits.images[keep] / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    path = tmp_path_factory.mktemp("three") / "three.npz"
    np.savez(path, images=images, labels=digits.target[keep].astype(np.int64),
             class_names=np.array(CLASSES))
    return path


@dataclass
class PartitionHooks(RecordingHooks):
    """RecordingHooks that also record each lease's partition."""

    partitions: list[tuple[str | None, int, int, int]] = field(default_factory=list)

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        grant = super().acquire_steps(start, count, partition)
        self.partitions.append((partition, start, count, grant))
        return grant


def _spec(per_class: dict[str, DpSpec] | None = None,
          **overrides: object) -> FinetuneTraining:
    """A per-label finetune: ``per_class`` (default: each class's RATES and STEPS)."""
    if per_class is None:
        per_class = {c: DpSpec(noise_multiplier=1.0, sample_rate=RATES[c],
                               expected_batch_size=3, max_grad_norm=1.0, steps=STEPS[c])
                     for c in CLASSES}
    fields: dict[str, object] = dict(image_size=IMAGE_SIZE, num_classes=3,
                                     max_physical_batch_size=4, checkpoint_every=2,
                                     learning_rate=1e-3,
                                     privacy=PerLabel({c: RecordLevel(dp)
                                                       for c, dp in per_class.items()}))
    fields.update(overrides)
    return FinetuneTraining(**fields)  # type: ignore[arg-type]


def _per_class_dp(spec: FinetuneTraining) -> dict[str, DpSpec]:
    assert isinstance(spec.privacy, PerLabel)
    return {c: p.dp for c, p in spec.privacy.per_class.items()}


def _unet(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "unet" / "diffusion_pytorch_model.safetensors"))


def test_each_class_model_is_trained_on_its_class_only(
        pretrained: TrainingResult, three_classes: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[dict[str, object]] = []
    real_prepare, real_loss = ft_setup.prepare, ft_loop.per_sample_diffusion_loss

    def prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        run = real_prepare(*args, **kwargs)
        runs.append({"labels": kwargs["dataset"].labels.copy(), "latents": run.latents,
                     "null": run.info.null_class, "rows": [], "fed_labels": []})
        return run

    def loss(denoiser, scheduler, latents, labels, generator, **kwargs):  # type: ignore[no-untyped-def]
        runs[-1]["rows"].append(latents.detach().clone())  # type: ignore[attr-defined]
        runs[-1]["fed_labels"].append(labels.clone())  # type: ignore[attr-defined]
        return real_loss(denoiser, scheduler, latents, labels, generator, **kwargs)

    monkeypatch.setattr(ft_setup, "prepare", prepare)
    monkeypatch.setattr(ft_loop, "per_sample_diffusion_loss", loss)
    hooks = PartitionHooks()
    result = train(_spec(), dataset_path=three_classes, out_dir=tmp_path, hooks=hooks,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    labels = np.load(three_classes)["labels"]
    assert len(runs) == len(RecordingSampler.instances) == 3
    for index, (name, run, sampler) in enumerate(zip(CLASSES, runs, RecordingSampler.instances,
                                                     strict=True)):
        count = int((labels == index).sum())
        assert (run["labels"] == index).all() and len(run["labels"]) == count  # type: ignore[union-attr, arg-type]
        # Its own Poisson sampler over its own records, at its own accounted q.
        assert (sampler.num_records, sampler.sample_rate, sampler.draws) == (
            count, RATES[name], STEPS[name])
        own = {tuple(r.flatten().tolist()) for r in run["latents"]}  # type: ignore[attr-defined]
        fed = [tuple(r.flatten().tolist()) for batch in run["rows"] for r in batch]  # type: ignore[attr-defined]
        # every example it saw is one of its class's, or a padding row (all-zero latent,
        # loss masked to 0) filling the step to its fixed, public row count (dp.padding)
        real_fed = [r for r in fed if any(r)]
        assert real_fed and set(real_fed) <= own
        # Unconditional: every label fed is the null class (no label dropout draw matters).
        assert all((lab == run["null"]).all() for lab in run["fed_labels"])  # type: ignore[attr-defined]
    # Latents of different classes never mix: the classes' example sets are disjoint.
    sets = [{tuple(r.flatten().tolist()) for r in run["latents"]} for run in runs]  # type: ignore[attr-defined]
    assert not (sets[0] & sets[1]) and not (sets[1] & sets[2]) and not (sets[0] & sets[2])
    # Leases name the class; steps are numbered from 0 per class.
    assert [(p, s, c) for p, s, c, _ in hooks.partitions] == [
        ("zero", 0, 2), ("zero", 2, 1), ("one", 0, 2), ("one", 2, 1), ("two", 0, 2)]
    assert hooks.progress == [(s, 8) for s in range(1, 9)]  # over all classes' steps
    assert result.steps_by_partition == STEPS and result.steps_completed == 8
    assert not result.stopped_early
    # One bundle: shared VAE and scheduler, one denoiser per class, each its class's model.
    info = read_model_info(result.model_dir)
    assert info.extra["per_label"] is True
    assert info.extra["denoisers"] == {"zero": "denoisers/0", "one": "denoisers/1",
                                       "two": "denoisers/2"}
    assert info.extra["steps_by_partition"] == STEPS and info.steps == 8
    trained = [_unet(tmp_path / "per_label" / str(i) / "model") for i in range(3)]
    for index, name in enumerate(CLASSES):
        bundled = _unet(result.model_dir / "denoisers" / str(index))
        assert all(torch.equal(bundled[k], trained[index][k]) for k in bundled)
        parts, class_info = load_model_denoiser(result.model_dir, name)
        assert class_info.steps == STEPS[name]
        assert class_info.extra["per_label_class"] == name
        loaded = parts.unet.state_dict()
        assert all(torch.equal(loaded[k], trained[index][k]) for k in trained[index])
    assert any(not torch.equal(trained[0][k], trained[1][k]) for k in trained[0])
    assert set(load_per_label_denoisers(result.model_dir)) == set(CLASSES)
    assert result.trainable_parameters == 3 * int(read_model_info(
        tmp_path / "per_label" / "0" / "model").extra["trainable_parameters"])


def test_resume_skips_finished_classes_and_continues_the_current_one(
        pretrained: TrainingResult, three_classes: Path, tmp_path: Path) -> None:
    first = PartitionHooks(budget=4)  # class "zero" (3 steps) + 1 step of class "one"
    result = train(_spec(), dataset_path=three_classes, out_dir=tmp_path / "a", hooks=first,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded(1))
    assert result.stopped_early
    assert result.steps_by_partition == {"zero": 3, "one": 1, "two": 0}
    # Checkpoint steps count over all classes: "zero" step 2, its end (3), "one" step 1.
    assert [s for s, _ in first.checkpoints] == [2, 3, 4]
    ckpt = first.checkpoints[-1][1]
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["done"] == {"zero": 3} and state["current"] == {"class": "one", "step": 1}
    assert "trainable_parameter_names" not in state and not (ckpt / "rng_state.pth").exists()
    samplers_before = len(RecordingSampler.instances)
    second = PartitionHooks()
    resumed = train(_spec(), dataset_path=three_classes, out_dir=tmp_path / "b", hooks=second,
                    base_model_dir=pretrained.model_dir, resume_from=ckpt,
                    _test_generator=seeded(2))
    # "zero" is not trained again; "one" continues at its step 1; "two" starts at 0.
    assert [(p, s, c) for p, s, c, _ in second.partitions] == [
        ("one", 1, 2), ("two", 0, 2)]
    assert len(RecordingSampler.instances) - samplers_before == 2
    assert resumed.steps_by_partition == STEPS and not resumed.stopped_early
    assert second.progress[0] == (5, 8) and second.progress[-1] == (8, 8)
    assert "per_label_class" not in read_model_info(tmp_path / "b" / "model").extra
    kept_a, kept_b = (_unet(d / "model" / "denoisers" / "0") for d in (tmp_path / "a",
                                                                          tmp_path / "b"))
    assert all(torch.equal(kept_a[k], kept_b[k]) for k in kept_a)
    one = json.loads((tmp_path / "b" / "per_label" / "1" / "trainer_state.json").read_text())
    assert (one["start_step"], one["step"]) == (1, 3)


def test_per_label_specs_must_name_the_dataset_classes(
        pretrained: TrainingResult, three_classes: Path, tmp_path: Path) -> None:
    fewer = {k: v for k, v in _per_class_dp(_spec()).items() if k != "two"}
    with pytest.raises(InvalidSpecError):
        train(_spec(fewer), dataset_path=three_classes, out_dir=tmp_path,
              base_model_dir=pretrained.model_dir, _test_generator=seeded())


def test_a_class_without_records_runs_its_steps_as_pure_noise(
        pretrained: TrainingResult, three_classes: Path, tmp_path: Path) -> None:
    # The owner declared a fourth class that no record carries: its true count (0) is
    # private, so its run must look like any other (same steps, noise released).
    with np.load(three_classes) as npz:
        four = tmp_path / "four.npz"
        np.savez(four, images=npz["images"], labels=npz["labels"],
                 class_names=np.array([*CLASSES, "three"]))
    spec = _spec(num_classes=4)
    empty = DpSpec(noise_multiplier=1.0, sample_rate=0.5, expected_batch_size=3,
                   max_grad_norm=1.0, steps=2)
    hooks = PartitionHooks()
    result = train(_spec({**_per_class_dp(spec), "three": empty}, num_classes=4),
                   dataset_path=four, out_dir=tmp_path / "out", hooks=hooks,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    assert result.steps_by_partition == {**STEPS, "three": 2} and not result.stopped_early
    sampler = RecordingSampler.instances[-1]
    assert (sampler.num_records, [len(b) for b in sampler.batches]) == (0, [0, 0])
    assert hooks.partitions[-1] == ("three", 0, 2, 2)
    base, noised = _unet(pretrained.model_dir), _unet(result.model_dir / "denoisers" / "3")
    changed = [k for k in base if not torch.equal(base[k], noised[k])]
    assert changed and all(".attn1." in k or ".attn2." in k for k in changed)
