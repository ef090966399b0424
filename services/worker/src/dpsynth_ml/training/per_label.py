"""Per-label DP fine-tuning (DP-DocLDM's best setting): one denoiser per class.

For each class c of the dataset's label domain, in domain order, a fresh copy of the base
model is DP-finetuned on the records labelled c only, unconditionally (every label is the
null class, so label dropout is moot), with that class's own :class:`DpSpec` (q_c = B_c /
N̂_c from the owner's declared class size, sigma_c, steps_c). The classes partition the
records by a fixed function of each record (its label), so the runs compose in parallel:
the ledger keeps one accumulator per class and step leases name their partition
(``hooks.acquire_steps(start, count, partition=class_name)``, steps numbered from 0 per
class). Only the records of the class are read by its run: its Poisson sampler ranges over
them, so a record outside the class is never sampled there. Every class's steps process
the same fixed number of rows for the same public (N̂_c, q_c, steps_c), whatever its true
size, a class without records included (``dp.padding``), and every class encodes N̂_c
records' worth of images before its first step (``padded_encoding``): the classes' true
sizes do not show in the progress timing.

Subject datasets (user-level DP-SGD): class c's run samples subjects at q_c = B_c / N̂_c
(N̂_c counts the subjects with an image in c) and each sampled subject contributes the
mean gradient of its class-c images only. When a subject has images in several classes the
classes are NOT disjoint in the unit: the ledger then sums the classes' runs (sequential
composition) instead of taking their max; the training itself is the same.

Outputs: ``out_dir/model`` is one per-label bundle (:func:`model_io.save_per_label_model`);
``out_dir/per_label/<index>/`` holds each class's ordinary finetune directory. A checkpoint
``out_dir/checkpoints/step-NNNNNNN/`` (NNNNNNN = steps done over all classes) holds::

    trainer_state.json   kind "finetune_per_label", the classes done (with their steps), the
                         class in progress and its step, every class's DP parameters
    finished/            a per-label bundle of the classes done (absent when none is)
    current/             the in-progress class's finetune checkpoint (absent between classes)

so a resume skips the finished classes and resumes the current one with fresh randomness.

Device: ``placement`` (one device, rank 0 of 1; :func:`dpsynth_ml.train_placed` passes the
worker's first device) is every class's run's placement, so each class encodes its records
and trains on that device exactly as a whole-dataset finetune does (``finetune.setup``).
The classes run one after the other; a per-label job is not split across ranks.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.models.model_io import (
    export_denoiser,
    per_label_denoiser_dirs,
    read_model_info,
    save_per_label_model,
    write_model_info,
)
from dpsynth_ml.parallel.distributed import Placement
from dpsynth_ml.spec import (
    CentralImages,
    DpSpec,
    FinetuneTraining,
    InvalidSpecError,
    PerLabel,
    RngKind,
    TrainingResult,
)
from dpsynth_ml.training.checkpoint import read_trainer_state, write_trainer_state
from dpsynth_ml.training.finetune import run_finetune
from dpsynth_ml.training.hooks import TrainingHooks

STATE_KIND = "finetune_per_label"


def run_per_label(spec: FinetuneTraining, *, dataset_path: Path, out_dir: Path,
                  hooks: TrainingHooks, base_model_dir: Path | None,
                  resume_from: Path | None, generator: torch.Generator,
                  rng: RngKind, placement: Placement | None = None) -> TrainingResult:
    """Train (or resume) one DP denoiser per class; see the module docstring.

    Raises:
        InvalidSpecError: no base model, a privacy that is not ``PerLabel``, classes not
            exactly the dataset's, or a checkpoint written under other per-class DP
            parameters, or a placement of several ranks.
    """
    if not isinstance(spec.privacy, PerLabel):
        raise InvalidSpecError("a per-label finetune's privacy is PerLabel")
    placement = placement if placement is not None else Placement()
    if placement.distributed:
        raise InvalidSpecError("a per-label finetune runs on one device (not on several ranks)")
    if base_model_dir is None:
        raise InvalidSpecError("a per-label finetune needs base_model_dir: every class "
                               "starts from a fresh copy of the base model")
    dataset = load_dataset(dataset_path)
    if set(spec.privacy.per_class) != set(dataset.class_names):
        raise InvalidSpecError("the per-label privacy must name exactly the dataset's classes")
    job = _PerLabelJob(spec, dataset=dataset, dataset_path=Path(dataset_path),
                       out_dir=Path(out_dir), hooks=hooks, base_model_dir=Path(base_model_dir),
                       generator=generator, rng=rng, placement=placement)
    current = job.restore(Path(resume_from)) if resume_from is not None else None
    return job.run(current)


class _PerLabelJob:
    """The classes' runs in order, their bookkeeping and the combined checkpoints."""

    def __init__(self, spec: FinetuneTraining, *, dataset: ImageDataset, dataset_path: Path,
                 out_dir: Path, hooks: TrainingHooks, base_model_dir: Path,
                 generator: torch.Generator, rng: RngKind,
                 placement: Placement | None = None) -> None:
        if not isinstance(spec.privacy, PerLabel):
            raise InvalidSpecError("a per-label finetune's privacy is PerLabel")
        self.privacy: PerLabel = spec.privacy
        self.spec, self.dataset, self.dataset_path = spec, dataset, dataset_path
        self.out_dir, self.hooks, self.base_model_dir = out_dir, hooks, base_model_dir
        self.generator, self.rng = generator, rng
        self.placement = placement if placement is not None else Placement()
        self.classes = dataset.class_names
        self.dp: Mapping[str, DpSpec] = {c: p.dp for c, p in self.privacy.per_class.items()}
        self.total = sum(self.dp[c].steps for c in self.classes)
        self.finished: dict[str, Path] = {}  # class -> its released model dir
        self.steps: dict[str, int] = {}  # class -> logical steps done (all attempts)

    def class_dir(self, name: str) -> Path:
        return self.out_dir / "per_label" / str(self.classes.index(name))

    def restore(self, resume_from: Path) -> tuple[str, Path] | None:
        """Take over the finished classes of a checkpoint; return the class to resume."""
        state = read_trainer_state(resume_from)
        if state.get("kind") != STATE_KIND or state.get("dp") != self._dp_records():
            raise InvalidSpecError("checkpoint was written under other per-label DP specs")
        for name, steps in dict(state["done"]).items():
            dest = self.class_dir(name) / "model"
            if dest.exists():
                shutil.rmtree(dest)
            self.finished[name] = export_denoiser(resume_from / "finished", name, dest)
            self.steps[name] = int(steps)
        current = state.get("current")
        if current is None:
            return None
        return str(current["class"]), resume_from / "current"

    def run(self, current: tuple[str, Path] | None) -> TrainingResult:
        """Run the classes not finished yet, in domain order; stop when a run stops."""
        stopped = False
        partial: dict[str, Path] = {}
        for name in self.classes:
            if name in self.finished:
                continue
            resume = current[1] if current is not None and current[0] == name else None
            class_spec, class_data = class_run(self.spec, self.dataset, name)
            result = run_finetune(
                class_spec, dataset_path=self.dataset_path,
                dataset=class_data, out_dir=self.class_dir(name),
                hooks=_ClassHooks(self, name), base_model_dir=self.base_model_dir,
                resume_from=resume, generator=self.generator, rng=self.rng,
                placement=self.placement)
            self.steps[name] = result.steps_completed
            if result.stopped_early:
                partial[name], stopped = result.model_dir, True
                break
            self.finished[name] = result.model_dir
            self.checkpoint()  # class boundary: this class is done
        bundled = {n: self.finished.get(n) or partial[n] for n in self.classes
                   if n in self.finished or n in partial}
        model_dir = _with_fixed_batches(save_per_label_model(bundled, self.out_dir / "model"),
                                        bundled)
        write_trainer_state(self.out_dir, self._state(None))
        trainable = sum(int(read_model_info(d).extra.get("trainable_parameters", 0))  # type: ignore[call-overload]
                        for d in bundled.values())
        denoisers = per_label_denoiser_dirs(read_model_info(model_dir)).values()
        total = _scalars(model_dir / "vae") + sum(_scalars(model_dir / rel / part)
                                                   for rel in denoisers
                                                   for part in ("unet", "class_embedder"))
        return TrainingResult(
            steps_completed=sum(self.steps.values()), stopped_early=stopped,
            model_dir=model_dir, trainable_parameters=trainable, total_parameters=total,
            rng=self.rng, steps_by_partition={n: self.steps.get(n, 0) for n in self.classes},
            device=str(self.placement.device))

    def checkpoint(self, current: tuple[str, int, Path] | None = None) -> None:
        """Write a combined checkpoint (finished classes + the class in progress)."""
        done_steps = sum(self.steps[n] for n in self.finished)
        step = done_steps + (current[1] if current is not None else 0)
        ckpt = self.out_dir / "checkpoints" / f"step-{step:07d}"
        if ckpt.exists():
            shutil.rmtree(ckpt)
        ckpt.mkdir(parents=True)
        if self.finished:
            save_per_label_model({n: self.finished[n] for n in self.classes
                                  if n in self.finished}, ckpt / "finished")
        if current is not None:
            shutil.copytree(current[2], ckpt / "current")
        write_trainer_state(ckpt, self._state(current))
        self.hooks.on_checkpoint(step, ckpt)

    def _dp_records(self) -> dict[str, dict[str, float | int]]:
        # the mechanism's parameters only: (epsilon, delta) size the padding, and a
        # checkpoint written before they were passed must still resume
        return {name: {k: v for k, v in dataclasses.asdict(self.dp[name]).items()
                       if k not in ("epsilon", "delta")} for name in self.classes}

    def _state(self, current: tuple[str, int, Path] | None) -> dict[str, object]:
        done = {n: self.steps[n] for n in self.classes if n in self.finished}
        step = sum(done.values()) + (current[1] if current is not None else 0)
        return {"kind": STATE_KIND, "step": step, "classes": list(self.classes),
                "done": done, "dp": self._dp_records(),
                "current": ({"class": current[0], "step": current[1]}
                            if current is not None else None),
                "steps_by_partition": {n: self.steps[n] for n in self.classes
                                       if n in self.steps}}


class _ClassHooks:
    """The job's hooks as one class's run sees them.

    Leases name the class as their partition (per-class step numbering from 0); progress is
    reported over the total of all classes; a class checkpoint becomes a combined one.
    """

    def __init__(self, job: _PerLabelJob, name: str) -> None:
        self._job, self._name = job, name
        self._offset = sum(job.steps[n] for n in job.finished)
        self._index = job.classes.index(name)

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        return self._job.hooks.acquire_steps(start, count, partition=self._name)

    def charge_release(self, release: CentralImages) -> None:
        # a per-label finetune takes no central_images (spec); forwarded all the same
        self._job.hooks.charge_release(release)

    def should_stop(self) -> bool:
        return self._job.hooks.should_stop()

    def on_progress(self, step: int, total: int) -> None:
        self._job.hooks.on_progress(self._offset + step, self._job.total)

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        self._job.steps[self._name] = step
        if step >= self._job.dp[self._name].steps:
            return  # the class is complete: checkpointed with its released model, after it
        self._job.checkpoint((self._name, step, checkpoint_dir))

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        self._job.hooks.on_private_stats({**stats, "partition_index": float(self._index)})


def class_run(spec: FinetuneTraining, dataset: ImageDataset,
              name: str) -> tuple[FinetuneTraining, ImageDataset]:
    """Class ``name``'s run of a per-label finetune: its spec (that class's DpSpec,
    unconditional: every label is the null class, so label dropout does nothing) and its
    records. The per-label trainer and its audit (``dpsynth_ml.audit_finetune``) both run
    exactly this.

    Raises:
        InvalidSpecError: ``spec`` is not per-label, or ``name`` is not one of its classes
            and the dataset's.
    """
    if not isinstance(spec.privacy, PerLabel):
        raise InvalidSpecError("a per-label finetune's privacy is PerLabel")
    names = list(dataset.class_names)
    if name not in spec.privacy.per_class or name not in names:
        raise InvalidSpecError(f"{name!r} is not a class of this per-label finetune")
    return (dataclasses.replace(spec, privacy=spec.privacy.per_class[name],
                                class_conditional=False, label_dropout=0.0),
            _class_subset(dataset, names.index(name)))


def _class_subset(dataset: ImageDataset, index: int) -> ImageDataset:
    """The records labelled ``index`` (with their masks), keeping the label domain."""
    keep = np.flatnonzero(dataset.labels == index)
    # subject datasets: the class's images keep their subjects (and the dataset's S); a
    # subject without an image in the class is never part of the class's batches.
    return ImageDataset(images=dataset.images[keep], labels=dataset.labels[keep],
                        class_names=dataset.class_names,
                        masks=dataset.masks[keep] if dataset.masks is not None else None,
                        subjects=(dataset.subjects[keep] if dataset.subjects is not None
                                  else None), num_subjects=dataset.num_subjects)


def _with_fixed_batches(model_dir: Path, classes: Mapping[str, Path]) -> Path:
    """The bundle's info names each class's fixed per-step work (dp.padding), not only the
    first class's, which the bundle's info would otherwise inherit."""
    info = read_model_info(model_dir)
    extra = {k: v for k, v in info.extra.items() if k != "fixed_batch"}
    extra["fixed_batch_by_partition"] = {
        name: read_model_info(d).extra.get("fixed_batch") for name, d in classes.items()}
    write_model_info(dataclasses.replace(info, extra=extra), model_dir)
    return model_dir


def _scalars(part_dir: Path) -> int:
    """Scalars stored in a model part's safetensors files (read from their headers)."""
    count = 0
    for path in sorted(Path(part_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                count += math.prod(fh.get_slice(key).get_shape())
    return count
