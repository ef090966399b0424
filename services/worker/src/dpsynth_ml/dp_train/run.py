"""Direct DP training of an image classifier (issue 20, item 1): the finetune's mechanism,
a classifier's loss.

The same pieces as a DP finetune (``dpsynth_ml.training.finetune``): Poisson sampling at the
ledger's q over images or subjects (``PoissonSampler`` / ``SubjectPoissonSampler``), each
logical batch padded to the fixed rows of public quantities (``dp.padding``: the work per
step does not reveal the batch size), per-example (or per-subject, clipped once) clipping
to C and ONE Gaussian draw of std sigma*C per step, divided by the public expected batch
size (opacus through :class:`~dpsynth_ml.dp.DpSgdEngine`, whose ChaCha20 noise is keyed from
OS entropy), then Adam (DP-Adam) or SGD on the privatised gradient. Steps are leased from the
platform in chunks of ``checkpoint_every`` before they run (``TrainingHooks``), and every
chunk ends with a checkpoint that a resume continues from.

The model folder it writes: ``model.safetensors`` (the weights) and
``dpsynth_classifier.json`` (architecture, input format, class names, the DP settings, steps,
rng). Nothing here logs or returns a statistic of the private data except the owner-only
training statistics the hooks receive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.dp import DpSgdEngine, PoissonSampler, SubjectPoissonSampler
from dpsynth_ml.dp.noise import NoiseSource
from dpsynth_ml.dp.padding import (
    FixedBatch,
    fixed_batch,
    gather_rows,
    mask_losses,
    pad_groups,
    pad_indices,
)
from dpsynth_ml.dp_train.models import DpClassifier, build_classifier
from dpsynth_ml.dp_train.spec import ClassifierTraining
from dpsynth_ml.spec import InvalidSpecError, RngKind, SubjectLevel, TrainingResult
from dpsynth_ml.training.entry import os_seeded_generator
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.training.leases import leased_steps

MODEL_FILE, INFO_FILE, STATE_FILE = ("model.safetensors", "dpsynth_classifier.json",
                                     "trainer_state.pt")


@dataclass
class _Run:
    spec: ClassifierTraining
    model: DpClassifier
    engine: DpSgdEngine
    sampler: PoissonSampler | SubjectPoissonSampler
    fixed: FixedBatch
    images: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]
    out_dir: Path
    device: torch.device
    rng: RngKind
    start_step: int = 0
    checkpointed: int = -1  # the step of the last checkpoint this attempt wrote
    info: dict[str, Any] = field(default_factory=dict)


def dp_train_classifier(spec: ClassifierTraining, *, dataset_path: Path, out_dir: Path,
                        hooks: TrainingHooks, generator: torch.Generator | None = None,
                        rng: RngKind = "os", init_model_dir: Path | None = None,
                        resume_from: Path | None = None,
                        device: torch.device | str = "cpu") -> TrainingResult:
    """Train ``spec``'s classifier on the private dataset at ``dataset_path`` with DP-SGD.

    Args:
        spec: the classifier and the ledger's DP settings.
        dataset_path: the canonical npz (images, labels, class names; subjects for a
            subject-level spec).
        out_dir: checkpoints (``checkpoints/step-NNNNNNNN``) and the final ``model``.
        hooks: leases, cancellation, progress, checkpoints, owner-only statistics.
        generator: TESTS ONLY: the Poisson sampling (and, with ``rng == "test"``, the noise
            key); None, as in production: a generator seeded from OS entropy.
        rng: ``os`` in production; ``test`` when a test injected ``generator``.
        init_model_dir: a PUBLIC classifier of the same architecture and input to start
            from (e.g. one trained on a public dataset); None: a fresh initialisation.
        resume_from: a checkpoint folder of an earlier attempt of this job.
        device: where the model, the images and the per-example gradients live.

    Raises:
        InvalidSpecError: a dataset the spec cannot train on (classes, subjects), an init
            model of another architecture or input.
    """
    if generator is None:
        generator, rng = os_seeded_generator(), "os"
    run = _prepare(spec, dataset_path=dataset_path, out_dir=Path(out_dir),
                   generator=generator, rng=rng, init_model_dir=init_model_dir,
                   resume_from=resume_from, device=torch.device(device))
    try:
        step, stopped = _loop(run, hooks)
        if step > run.start_step and step != run.checkpointed:
            # stopped between checkpoints (cancel, drain, budget): keep the granted steps
            # done, so a resume continues from here rather than the last chunk's end
            hooks.on_checkpoint(step, _checkpoint(run, step))
    finally:
        run.engine.close()
    model_dir = save_classifier(run.model, _info(run, step), Path(out_dir) / "model")
    total = sum(p.numel() for p in run.model.parameters())
    return TrainingResult(steps_completed=step, stopped_early=stopped, model_dir=model_dir,
                          trainable_parameters=total, total_parameters=total, rng=run.rng,
                          device=str(run.device))


def _prepare(spec: ClassifierTraining, *, dataset_path: Path, out_dir: Path,
             generator: torch.Generator, rng: RngKind, init_model_dir: Path | None,
             resume_from: Path | None, device: torch.device,
             _test_noise: NoiseSource | None = None) -> _Run:
    """Load the data and the model, build the sampler and the engine (``_test_noise``:
    TESTS ONLY, a noise source in place of ChaCha20, as ``DpSgdEngine`` takes it)."""
    dataset = load_dataset(dataset_path)
    privacy, dp = spec.privacy, spec.privacy.dp
    num_classes = len(dataset.class_names)
    if resume_from is not None:
        model, saved = load_classifier(resume_from)
        start_step = int(saved["steps"])
        if start_step > dp.steps:
            raise InvalidSpecError("the checkpoint is past the job's steps")
        rng = "test" if saved.get("rng") == "test" else rng
    elif init_model_dir is not None:
        model, saved = load_classifier(init_model_dir)
        start_step = 0
    else:
        model, start_step = build_classifier(spec.architecture, image_size=spec.image_size,
                                             channels=spec.channels,
                                             num_classes=num_classes), 0
    if (model.kind, model.image_size, model.channels, model.num_classes) != (
            spec.architecture, spec.image_size, spec.channels, num_classes):
        raise InvalidSpecError("the initial model's architecture, input or classes differ "
                               "from the job's")
    model.to(device).train()
    rows_per_unit = privacy.max_images_per_subject if isinstance(privacy, SubjectLevel) else 1
    fixed = fixed_batch(sample_rate=dp.sample_rate, expected_batch_size=dp.expected_batch_size,
                        steps=dp.steps, epsilon=dp.epsilon, delta=dp.delta,
                        rows_per_unit=rows_per_unit)
    sampler = _sampler(spec, dataset, generator, fixed.population)
    optimizer: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=spec.learning_rate) if spec.optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=spec.learning_rate,
                             momentum=spec.momentum))
    if resume_from is not None and (resume_from / STATE_FILE).exists():
        state = torch.load(resume_from / STATE_FILE, map_location=device, weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
    engine = DpSgdEngine(model, optimizer, noise_multiplier=dp.noise_multiplier,
                         max_grad_norm=dp.max_grad_norm,
                         expected_batch_size=dp.expected_batch_size,
                         generator=generator if rng == "test" else None,
                         _test_noise=_test_noise)
    images = model.to_input(dataset.images).to(device)
    labels = torch.from_numpy(dataset.labels).to(device)
    return _Run(spec=spec, model=model, engine=engine, sampler=sampler, fixed=fixed,
                images=images, labels=labels, class_names=tuple(dataset.class_names),
                out_dir=out_dir, device=device, rng=rng, start_step=start_step)


def _sampler(spec: ClassifierTraining, dataset: ImageDataset, generator: torch.Generator,
             population: int) -> PoissonSampler | SubjectPoissonSampler:
    dp = spec.privacy.dp
    if isinstance(spec.privacy, SubjectLevel):
        if dataset.subjects is None or dataset.num_subjects is None:
            raise InvalidSpecError("privacy_unit 'subject' needs a dataset with subjects")
        return SubjectPoissonSampler(
            dataset.subjects, dataset.num_subjects, dp.sample_rate, generator,
            max_images_per_subject=spec.privacy.max_images_per_subject,
            public_size=population)
    if dataset.subjects is not None:
        raise InvalidSpecError("the dataset's privacy unit is 'subject': it trains only "
                               "with user-level DP-SGD")
    return PoissonSampler(len(dataset), dp.sample_rate, generator, public_size=population)


def _loop(run: _Run, hooks: TrainingHooks) -> tuple[int, bool]:
    """Lease steps in chunks of ``checkpoint_every``; (steps done, stopped early)."""
    return leased_steps(total=run.spec.privacy.dp.steps, start=run.start_step,
                        every=run.spec.checkpoint_every, hooks=hooks,
                        step=lambda: logical_step(run),
                        checkpoint=lambda step: hooks.on_checkpoint(step,
                                                                    _checkpoint(run, step)))


def logical_step(run: _Run) -> dict[str, float]:
    """One DP-SGD step: the clipped sum of a Poisson batch, noised once, applied."""
    stats = accumulate_step(run)
    run.engine.privatize()
    run.engine.apply_update()
    return stats


def accumulate_step(run: _Run) -> dict[str, float]:
    """The private half of a step: Poisson batch → fixed rows → micro-batches → each image
    (or subject: the mean of its sampled images' gradients) clipped once into the sum.
    Padding rows have their loss multiplied by 0, so their gradient is exactly 0."""
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    chunk_size = run.spec.max_physical_batch_size
    if isinstance(run.sampler, SubjectPoissonSampler):
        batch = run.sampler.sample()
        rows = pad_indices(batch.indices, run.fixed)
        total = len(rows)
        groups = pad_groups(batch.groups, total)
        weights = torch.zeros(total, dtype=torch.float64)
        size, units = int(batch.indices.numel()), batch.num_subjects
        if size:
            weights[:size] = (1.0 / batch.counts.to(torch.float64))[batch.groups]
    else:
        indices = run.sampler.sample()
        rows = pad_indices(indices, run.fixed)
        total = len(rows)
        size = units = int(indices.numel())
    clipped, loss_sum = 0, 0.0
    for start in range(0, total, chunk_size):
        end = min(start + chunk_size, total)
        chunk, real = rows.indices[start:end], rows.real[start:end]
        x = gather_rows(run.images, chunk)
        y = gather_rows(run.labels, chunk)

        def draw(x: torch.Tensor = x, y: torch.Tensor = y,
                 real: torch.Tensor = real) -> torch.Tensor:
            return mask_losses(loss_fn(run.engine.module(x), y), real)

        if isinstance(run.sampler, SubjectPoissonSampler):
            carry_in = start > 0 and bool(groups[start] == groups[start - 1])
            carry_out = end < total and bool(groups[end] == groups[end - 1])
            n, losses = run.engine.accumulate_subject_draws(
                draw, 1, groups[start:end] - groups[start], weights[start:end],
                carry_in=carry_in, carry_out=carry_out)
        else:
            n, losses = run.engine.accumulate_draws(draw, 1)
        clipped += n
        loss_sum += float(losses.sum())
    stats = {"batch_size": float(units), "rows": float(total),
             "fraction_clipped": clipped / units if units else 0.0}
    if size:
        stats["loss"] = loss_sum / size
        if units != size:
            stats["images"] = float(size)
    return stats


def _info(run: _Run, step: int) -> dict[str, Any]:
    dp = run.spec.privacy.dp
    return {
        "format": "dpsynth-classifier/1", "architecture": run.spec.architecture,
        "image_size": run.spec.image_size, "channels": run.spec.channels,
        "num_classes": len(run.class_names), "class_names": list(run.class_names),
        "steps": step, "rng": run.rng, "optimizer": run.spec.optimizer,
        "learning_rate": run.spec.learning_rate,
        "privacy_unit": "subject" if isinstance(run.spec.privacy, SubjectLevel) else "image",
        "dp": {"noise_multiplier": dp.noise_multiplier, "sample_rate": dp.sample_rate,
               "expected_batch_size": dp.expected_batch_size,
               "max_grad_norm": dp.max_grad_norm, "steps": dp.steps},
        "fixed_batch": run.fixed.record()}


def _checkpoint(run: _Run, step: int) -> Path:
    folder = save_classifier(run.model, _info(run, step),
                             run.out_dir / "checkpoints" / f"step-{step:08d}")
    torch.save({"optimizer": run.engine.original_optimizer.state_dict(), "step": step},
               folder / STATE_FILE)
    run.checkpointed = step
    return folder


def save_classifier(model: DpClassifier, info: dict[str, Any], folder: Path) -> Path:
    """Write ``model``'s weights (safetensors) and ``info`` to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in _plain(model).state_dict().items()}
    save_file(state, str(folder / MODEL_FILE))
    (folder / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
    return folder


def load_classifier(folder: Path) -> tuple[DpClassifier, dict[str, Any]]:
    """A classifier folder written by :func:`save_classifier` (safetensors only: no code
    and no pickle is loaded), and its info.

    Raises:
        InvalidSpecError: a folder without the files, or weights that do not fit.
    """
    try:
        info = json.loads((folder / INFO_FILE).read_text())
        model = build_classifier(str(info["architecture"]), image_size=int(info["image_size"]),
                                 channels=int(info["channels"]),
                                 num_classes=int(info["num_classes"]))
        model.load_state_dict(load_file(str(folder / MODEL_FILE)))
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise InvalidSpecError(f"not a dpsynth classifier folder: {exc}") from exc
    return model, info


def _plain(model: nn.Module) -> nn.Module:
    """The module without opacus' wrapper (``_module``), whose keys a plain load expects."""
    inner = getattr(model, "_module", None)
    return inner if isinstance(inner, nn.Module) else model
