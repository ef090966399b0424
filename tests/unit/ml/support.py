"""Helpers shared by the ML-core tests: datasets, specs, a recording fake of TrainingHooks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from dpsynth_ml import DpSpec, FinetuneTraining, NullHooks, RecordLevel, SubjectLevel
from dpsynth_ml.spec import CentralImages

IMAGE_SIZE = 16
NUM_RECORDS = 100


def write_digits(path: Path, n: int = NUM_RECORDS) -> Path:
    """sklearn digits (8x8, upscaled by the loader to 16x16) as a canonical npz."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:n] / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    np.savez(path, images=images, labels=digits.target[:n].astype(np.int64),
             class_names=np.array([f"digit {i}" for i in range(10)]))
    return path


def finetune_spec(**overrides: object) -> FinetuneTraining:
    """A 20-step tiny record-level DP finetune; ``dp_*`` keys override DpSpec fields and
    ``privacy_unit="subject"`` (with ``max_images_per_subject``) makes it user-level."""
    dp_fields: dict[str, object] = dict(noise_multiplier=1.0, sample_rate=0.16,
                                        expected_batch_size=16, max_grad_norm=1.0, steps=20)
    for key in [k for k in overrides if k.startswith("dp_")]:
        dp_fields[key[3:]] = overrides.pop(key)
    dp = DpSpec(**dp_fields)  # type: ignore[arg-type]
    cap = overrides.pop("max_images_per_subject", 8)
    subject = overrides.pop("privacy_unit", "image") == "subject"
    privacy = SubjectLevel(dp, max_images_per_subject=cap) if subject else RecordLevel(dp)  # type: ignore[arg-type]
    fields: dict[str, object] = dict(image_size=IMAGE_SIZE, max_physical_batch_size=8,
                                     checkpoint_every=5, learning_rate=1e-3, privacy=privacy)
    fields.update(overrides)
    return FinetuneTraining(**fields)  # type: ignore[arg-type]


def seeded(seed: int = 1234) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass
class RecordingHooks(NullHooks):
    """A fake TrainingHooks: grants up to ``budget`` steps, can stop after ``stop_after``."""

    budget: int | None = None
    stop_after: int | None = None
    acquired: list[tuple[int, int, int]] = field(default_factory=list)
    progress: list[tuple[int, int]] = field(default_factory=list)
    checkpoints: list[tuple[int, Path]] = field(default_factory=list)
    private_stats: list[Mapping[str, float]] = field(default_factory=list)
    releases: list[CentralImages] = field(default_factory=list)
    refuse_release: bool = False
    granted_total: int = 0

    def charge_release(self, release: CentralImages) -> None:
        """Record the charge; with ``refuse_release`` refuse it (an overspent budget)."""
        if self.refuse_release:
            raise RuntimeError("release refused: budget exhausted")
        self.releases.append(release)

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        grant = (count if self.budget is None
                 else max(0, min(count, self.budget - self.granted_total)))
        self.granted_total += grant
        self.acquired.append((start, count, grant))
        return grant

    def should_stop(self) -> bool:
        done = self.progress[-1][0] if self.progress else 0
        return self.stop_after is not None and done >= self.stop_after

    def on_progress(self, step: int, total: int) -> None:
        self.progress.append((step, total))

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        self.checkpoints.append((step, checkpoint_dir))

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        self.private_stats.append(dict(stats))


def model_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved model (UNet with LoRA unmerged, class embedder, VAE if the
    model has one) by name."""
    from dpsynth_ml.models.model_io import load_model
    from dpsynth_ml.models.trainable import plain_unet

    bundle, _ = load_model(model_dir)
    state: dict[str, torch.Tensor] = {}
    for prefix, module in (("unet", plain_unet(bundle.unet, merge=False)),
                           ("class_embedder", bundle.class_embedder), ("vae", bundle.vae)):
        if module is None:
            continue  # a pixel-space model has no VAE
        state.update({f"{prefix}.{k}": v for k, v in module.state_dict().items()})
    return state


def changed_parameters(before: dict[str, torch.Tensor],
                       after: dict[str, torch.Tensor]) -> set[str]:
    """The names whose tensors differ between two :func:`model_state` snapshots."""
    assert before.keys() == after.keys()
    return {k for k in before if not torch.equal(before[k], after[k])}
