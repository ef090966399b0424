"""Per-phase throughput of the ML core on one device: images per second of non-private
pretraining (latent and pixel space), a whole-dataset DP finetune, a per-label DP finetune
and sampling, each measured through the same entry points a worker uses
(``dpsynth_ml.train_placed`` with the device as its ``DEVICES`` setting, ``dpsynth_ml.sample``
with ``device=``), so every row records the device its phase ACTUALLY ran on (the result's
``device``), never the one that was asked for.

    python -m benchmarks.phase_throughput --out OUTDIR [--profile tiny|cpu|gpu] [--budget-s S]

Writes ``OUTDIR/phase_throughput.json`` after every phase (a time limit still leaves the
phases done so far). Each training phase is time-boxed by its hooks (``should_stop`` after
its share of the budget); its rate is measured between its first and its last progress
report, so model building, data encoding and the first (warm-up) step are not counted.
Images per DP step are the EXPECTED batch size (Poisson sampling; padding rows excluded).

Profiles: ``gpu`` (CUDA: preset "small", 32x32, large batches, ~90 s in all, then a short
CPU reference of each phase if the budget allows), ``cpu`` (the CPU, small settings) and
``tiny`` (the CPU, tiny preset, a few steps: the test of ``scripts/device_check.sh --tiny``).
Random images (throughput does not depend on their content).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PHASES = ("pretrain_latent", "pretrain_pixel", "dp_finetune", "per_label_finetune",
          "sampling")
OUT_FILE = "phase_throughput.json"


@dataclass(frozen=True)
class Profile:
    """The settings of one profile (see the module docstring)."""

    name: str
    preset: str
    image_size: int
    records: int
    classes: int
    batch_size: int
    dp_batch: int
    samples_per_class: int
    sampling_steps: int
    budget_s: float  # all phases on the main device
    max_steps: int | None = None  # per training phase (tiny: a few steps, not a time box)
    trainable: str = "full"  # the DP finetunes' trainable set


PROFILES: Mapping[str, Profile] = {
    "tiny": Profile("tiny", "tiny", 16, 16, 2, 4, 4, 2, 2, 60.0, max_steps=2,
                    trainable="attention"),
    "cpu": Profile("cpu", "tiny", 16, 128, 4, 8, 8, 4, 10, 90.0, trainable="attention"),
    "gpu": Profile("gpu", "small", 32, 8192, 10, 256, 256, 100, 25, 90.0),
}


class _Clock:
    """TrainingHooks that grant every step, stop after ``seconds`` of steps and record
    when each progress report came (the phase's rate is taken between the first and the
    last)."""

    def __init__(self, seconds: float, max_steps: int | None = None,
                 hard_s: float | None = None) -> None:
        self.seconds, self.max_steps = seconds, max_steps
        self.started = time.perf_counter()
        # past this the phase stops even without a timed step (it then reports 0 images/s)
        self.hard = self.started + (hard_s if hard_s is not None else 2 * seconds)
        self.reports: list[tuple[int, float]] = []

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        return count

    def charge_release(self, release: object) -> None:  # no central images here
        pass

    def should_stop(self) -> bool:
        if self.max_steps is not None and len(self.reports) >= self.max_steps:
            return True
        # at least two reports (one timed step) unless the hard limit is reached
        now = time.perf_counter()
        return now > self.hard or (now - self.started > self.seconds and len(self.reports) >= 2)

    def on_progress(self, step: int, total: int) -> None:
        self.reports.append((step, time.perf_counter()))

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        pass

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        pass

    def rate(self, images_per_step: float) -> tuple[float, int, float]:
        """(images/s, steps timed, seconds timed) between the first and last report."""
        if len(self.reports) < 2:
            return 0.0, 0, 0.0
        (s0, t0), (s1, t1) = self.reports[0], self.reports[-1]
        steps, seconds = s1 - s0, t1 - t0
        return (images_per_step * steps / seconds if seconds > 0 else 0.0), steps, seconds


def _write_dataset(path: Path, profile: Profile, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    size = profile.image_size
    images = rng.integers(0, 256, size=(profile.records, size, size, 1), dtype=np.uint8)
    labels = (np.arange(profile.records) % profile.classes).astype(np.int64)
    np.savez(path, images=images, labels=labels,
             class_names=np.array([f"class {i}" for i in range(profile.classes)]))
    return path


class _Phases:
    """The phases on one device, each writing its row as soon as it ends."""

    def __init__(self, profile: Profile, device: str, work: Path,
                 record: Callable[[dict[str, Any]], None]) -> None:
        self.profile, self.device, self.work, self.record = profile, device, work, record
        work.mkdir(parents=True, exist_ok=True)
        self.data = _write_dataset(work / "data.npz", profile)
        self.latent_model: Path | None = None

    def pretrain(self, space: str, seconds: float, hard_s: float) -> dict[str, Any]:
        import dpsynth_ml

        p = self.profile
        spec = dpsynth_ml.PretrainTraining(
            preset=p.preset, image_size=p.image_size, channels=1, num_classes=p.classes,
            epochs=1000, batch_size=p.batch_size, space=space)  # type: ignore[arg-type]
        clock = _Clock(seconds, p.max_steps, hard_s)
        result = dpsynth_ml.train_placed(self.device, spec, dataset_path=self.data,
                                         out_dir=self.work / f"pretrain-{space}", hooks=clock)
        if space == "latent":
            self.latent_model = result.model_dir
        rate, steps, timed = clock.rate(p.batch_size)
        return {"device": result.device, "images_per_second": rate, "steps": steps,
                "seconds": timed, "batch_size": p.batch_size, "preset": p.preset,
                "note": ("VAE steps, then UNet steps, as far as the time box goes"
                         if space == "latent" else "UNet steps on pixels")}

    def _dp(self, per_label: bool) -> Any:
        import dpsynth_ml
        from dpsynth_ml.spec import DpSpec, PerLabel, RecordLevel

        p = self.profile
        per_class = p.records // p.classes
        population = per_class if per_label else p.records
        dp = DpSpec(noise_multiplier=1.0, sample_rate=min(1.0, p.dp_batch / population),
                    expected_batch_size=p.dp_batch, max_grad_norm=1.0, steps=100_000)
        privacy: Any = (PerLabel({f"class {i}": RecordLevel(dp) for i in range(p.classes)})
                        if per_label else RecordLevel(dp))
        return dpsynth_ml.FinetuneTraining(
            privacy=privacy, image_size=p.image_size, channels=1, num_classes=p.classes,
            trainable=p.trainable, max_physical_batch_size=p.dp_batch,  # type: ignore[arg-type]
            checkpoint_every=1_000_000)

    def finetune(self, seconds: float, hard_s: float, *,
                 per_label: bool = False) -> dict[str, Any]:
        import dpsynth_ml

        if self.latent_model is None:
            return {"status": "skipped", "reason": "no pretrained model (pretrain failed)"}
        clock = _Clock(seconds, self.profile.max_steps, hard_s)
        name = "per-label" if per_label else "finetune"
        result = dpsynth_ml.train_placed(self.device, self._dp(per_label),
                                         dataset_path=self.data, out_dir=self.work / name,
                                         hooks=clock, base_model_dir=self.latent_model)
        rate, steps, timed = clock.rate(self.profile.dp_batch)
        return {"device": result.device, "images_per_second": rate, "steps": steps,
                "seconds": timed, "expected_batch_size": self.profile.dp_batch,
                "trainable": self.profile.trainable,
                "note": ("the first class only, as far as the time box goes"
                         if per_label else "DP-SGD, float32, no autocast")}

    def sampling(self) -> dict[str, Any]:
        import dpsynth_ml

        if self.latent_model is None:
            return {"status": "skipped", "reason": "no pretrained model (pretrain failed)"}
        p = self.profile
        result = dpsynth_ml.sample(
            self.latent_model, samples_per_class=p.samples_per_class, sampler="ddim",
            steps=p.sampling_steps, guidance_scale=2.0, seed=0, out_dir=self.work / "corpus",
            batch_size=max(p.samples_per_class, 1), device=self.device)
        return {"device": result.device, "images_per_second": result.images_per_second,
                "images": result.total, "sampler": "ddim", "steps": p.sampling_steps,
                "guidance_scale": 2.0}

    def run(self, deadline: float) -> None:
        """Every phase, each time-boxed to an equal share of the time left before
        ``deadline`` (sampling is sized, not boxed); a phase stops at twice its share even
        without a timed step."""
        # the last 15 % of the time is sampling's (training phases end before it); a
        # profile with max_steps (tiny) is not time-boxed: each phase does its steps, up to
        # the deadline
        stepped = self.profile.max_steps is not None
        training_end = deadline - (0.0 if stepped else
                                   0.15 * max(0.0, deadline - time.monotonic()))

        def box(left: int) -> tuple[float, float]:
            if stepped:
                until = max(1.0, deadline - time.monotonic())
                return until, until
            share = max(1.0, (training_end - time.monotonic()) / left)
            return share * 0.8, share * 1.6

        plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("pretrain_latent", lambda: self.pretrain("latent", *box(5))),
            ("pretrain_pixel", lambda: self.pretrain("pixel", *box(4))),
            ("dp_finetune", lambda: self.finetune(*box(3))),
            ("per_label_finetune", lambda: self.finetune(*box(2), per_label=True)),
            ("sampling", self.sampling),
        ]
        for phase, measure in plan:
            if time.monotonic() > (deadline if phase == "sampling" else training_end):
                self.record({"phase": phase, "requested_device": self.device,
                             "status": "skipped", "reason": "no time left"})
                continue
            began = time.monotonic()
            try:
                row = {"status": "ok", **measure()}
                if row["status"] == "ok" and not row.get("images_per_second"):
                    row["status"] = "no_timed_step"  # its box ended before a second step
            except Exception as exc:  # noqa: BLE001  (one failing phase must not lose the rest)
                row = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500]}
            row.update({"phase": phase, "requested_device": self.device,
                        "wall_s": round(time.monotonic() - began, 2)})
            self.record(row)


def _device_for(profile: Profile) -> str:
    if profile.name != "gpu":
        return "cpu"
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def run(out: Path, profile_name: str, budget_s: float | None) -> dict[str, Any]:
    """Measure every phase; returns (and keeps rewriting) the document."""
    import torch

    profile = PROFILES[profile_name]
    total = budget_s if budget_s is not None else profile.budget_s
    started = time.monotonic()
    deadline = started + total
    device = _device_for(profile)
    doc: dict[str, Any] = {
        "profile": profile.name, "device": device, "budget_s": total,
        "cuda_available": bool(torch.cuda.is_available()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "phases": {}, "cpu_reference": {},
        "autocast": "bf16 in pretraining on CUDA only; never in a DP finetune",
    }
    out.mkdir(parents=True, exist_ok=True)

    def writer(section: str) -> Callable[[dict[str, Any]], None]:
        def record(row: dict[str, Any]) -> None:
            doc[section][row["phase"]] = row
            doc["elapsed_s"] = round(time.monotonic() - started, 2)
            (out / OUT_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
            print(f"[phase_throughput] {section} {row['phase']}: {row.get('status')} "
                  f"{row.get('images_per_second', 0.0):.1f} images/s on "
                  f"{row.get('device', row.get('requested_device'))}", flush=True)
        return record

    with tempfile.TemporaryDirectory(prefix="phase-throughput-") as scratch:
        main_budget = total * (0.75 if device != "cpu" else 0.9)
        _Phases(profile, device, Path(scratch) / "main", writer("phases")).run(
            started + main_budget)
        left = deadline - time.monotonic()
        if device != "cpu" and left > 20:  # the CPU beside the GPU, briefly
            ref = Profile("cpu-reference", profile.preset, profile.image_size, 256,
                          profile.classes, 16, 16, 2, profile.sampling_steps, left)
            _Phases(ref, "cpu", Path(scratch) / "cpu", writer("cpu_reference")).run(
                deadline - 0.1 * left)
    doc["elapsed_s"] = round(time.monotonic() - started, 2)
    (out / OUT_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True))
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--budget-s", type=float, default=None)
    args = parser.parse_args(argv)
    doc = run(args.out, args.profile, args.budget_s)
    failed = [p for p, row in doc["phases"].items() if row.get("status") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
