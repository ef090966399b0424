"""What each phase of ``BENCH_SCALE=gpu-smoke`` costs on this device, measured before the
smoke run is sized (issue 18, item 6): the settings of a scale are fixed before the run and
never chosen on the test set, but how many DP steps, draws and images fit in the device
check's minutes is a question of the machine, and this answers it on random images (no
private or test data; throughput does not depend on the pixels).

    python -m benchmarks.fmnist_smoke_probe --out OUTDIR [--budget-s 60]

Rows (``OUTDIR/smoke_probe.json``, rewritten after each; a time limit keeps the rows done):

* ``dp_step``: DP-SGD steps of the gpu-smoke UNet (28x28 pixels, the book-keeping engine,
  float32) at several physical batches and noise multiplicities K: seconds per step, rows
  (example-draws) per second and the device's peak memory; an out-of-memory is a row too.
* ``warmup``: the central-image warm-up's non-private steps (seconds per step).
* ``sampling``: images per second of DPM-Solver++ (20 steps) at batch 2,000.
* ``classifier``: seconds for the downstream CNN on 9,000 images, and one DP-Adam epoch of it
  on 60,000 at batch 4,096.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.phase_throughput import _Clock


def _random_fmnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 28, 28, 1), dtype=np.uint8),
            (np.arange(n) % 10).astype(np.int64))


def _peak_gb(device: str) -> float | None:
    import torch

    if not device.startswith("cuda"):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run(out: Path, budget_s: float, tiny: bool = False) -> dict[str, Any]:
    import torch
    from dpsynth_ml.parallel.placement import train_on_device
    from dpsynth_ml.spec import DpSpec, FinetuneTraining, RecordLevel

    import benchmarks.fmnist_no_public as nopub
    from benchmarks.fmnist_privacy_utility import CLASS_NAMES, save_npz

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    cfg = dict(nopub.SIZES["gpu-smoke"])
    warm_steps, per_class, big = 200, 200, 60000
    if tiny:  # the test: the same code on a small UNet, a few steps
        cfg["unet"] = {**nopub.CPU_UNET, "block_out_channels": [8, 8, 16]}
        cfg["sample_batch_size"], cfg["sampler_steps"] = 20, 2
        warm_steps, per_class, big = 2, 2, 600
    started = time.monotonic()
    doc: dict[str, Any] = {"device": device, "cuda_available": torch.cuda.is_available(),
                           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                           else None, "unet": cfg["unet"], "rows": []}
    out.mkdir(parents=True, exist_ok=True)

    def record(row: dict[str, Any]) -> None:
        row["at_s"] = round(time.monotonic() - started, 1)
        doc["rows"].append(row)
        (out / "smoke_probe.json").write_text(json.dumps(doc, indent=2))
        print(f"[smoke_probe] {json.dumps(row)}", flush=True)

    def left() -> float:
        return budget_s - (time.monotonic() - started)

    def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if left() < 3:
            record({"kind": name, "status": "skipped", "reason": "no time left"})
            return
        _reset_peak(device)
        t0 = time.monotonic()
        try:
            row = {"kind": name, "status": "ok", **fn()}
        except torch.cuda.OutOfMemoryError as exc:
            row = {"kind": name, "status": "out_of_memory", "reason": str(exc)[:300]}
        except Exception as exc:  # noqa: BLE001  (one failing row must not lose the rest)
            row = {"kind": name, "status": "error",
                   "reason": f"{type(exc).__name__}: {exc}"[:500],
                   "trace": traceback.format_exc()[-1500:]}
        row.update({"wall_s": round(time.monotonic() - t0, 1), "peak_gb": _peak_gb(device)})
        record(row)

    work = Path(tempfile.mkdtemp(prefix="smoke-probe-"))
    x, y = _random_fmnist(8192)
    data = work / "data.npz"
    save_npz(data, x, y, CLASS_NAMES)
    base = nopub._base_model(cfg, work / "base", 0)

    def dp_step(physical: int, draws: int, seconds: float) -> Callable[[], dict[str, Any]]:
        def measure() -> dict[str, Any]:
            dp = DpSpec(noise_multiplier=1.0, sample_rate=physical / len(x),
                        expected_batch_size=physical, max_grad_norm=1e-3, steps=100_000)
            spec = FinetuneTraining(image_size=28, channels=1, trainable="full",
                                    privacy=RecordLevel(dp), noise_multiplicity=draws,
                                    learning_rate=3e-4, max_physical_batch_size=physical,
                                    checkpoint_every=1_000_000)
            if tiny:  # the test: three reports (two timed steps) however slow the machine
                clock = _Clock(0.0, 3, hard_s=max(5.0, left() - 2))
            else:
                clock = _Clock(seconds, None, hard_s=min(3 * seconds, max(5.0, left() - 2)))
            result = train_on_device(device, spec, dataset_path=data,
                                     out_dir=work / f"dp-{physical}-{draws}", hooks=clock,
                                     base_model_dir=base)
            rate, steps, timed = clock.rate(physical)
            return {"physical_batch": physical, "draws": draws, "engine": "bookkeeping",
                    "device_ran": str(result.device), "steps_timed": steps,
                    "s_per_step": round(timed / steps, 4) if steps else None,
                    "examples_per_s": round(rate, 1),
                    "rows_per_s": round(rate * draws, 1)}
        return measure

    def warmup() -> dict[str, Any]:
        small = {**cfg, "private_size": len(x), "class_size": len(x) // 10,
                 "warmup_steps": warm_steps, "release_sample_rate": None}
        t0 = time.perf_counter()
        nopub._finetune(small, base, data, work / "warm", noise_std=1.0, sigma=1.0, steps=0)
        wall = time.perf_counter() - t0
        return {"warmup_steps": warm_steps, "batch": small["warmup_batch_size"],
                "s_per_step_upper": round(wall / warm_steps, 4),
                "note": "release + the warm-up steps + saving, divided by the steps"}

    def sampling() -> dict[str, Any]:
        from dpsynth_ml import sample

        result = sample(base, samples_per_class=per_class, sampler="dpm_solver++",
                        steps=cfg["sampler_steps"], guidance_scale=1.0, seed=0,
                        out_dir=work / "corpus", batch_size=cfg["sample_batch_size"],
                        device=device)
        return {"images": result.total, "images_per_s": round(result.images_per_second, 1),
                "device_ran": str(result.device)}

    def classifier() -> dict[str, Any]:
        from dpsynth_ml.evaluation import train_classifier
        from dpsynth_ml.evaluation.classifiers import Classifier

        from benchmarks.fmnist_privacy_utility import dp_adam_classifier

        t0 = time.perf_counter()
        n_cnn = 900 if tiny else 9000
        train_classifier("cnn", x[:n_cnn], y[:n_cnn], num_classes=10, seed=0, device=device)
        cnn_s = time.perf_counter() - t0
        big_x, big_y = _random_fmnist(big, 1)
        init = Classifier("cnn", image_size=28, channels=1, num_classes=10)
        t0 = time.perf_counter()
        dp_adam_classifier(init, big_x, big_y, epsilon=10.0, delta=1e-5,
                           cfg={"dpadam_batch_size": min(4096, big // 4), "dpadam_epochs": 1,
                                "dpadam_learning_rate": 1e-3, "max_grad_norm": 1.0,
                                "dpadam_physical_batch": 4096}, seed=0, device=device)
        return {"cnn_s": round(cnn_s, 1), "cnn_images": n_cnn,
                "dp_adam_epoch_s": round(time.perf_counter() - t0, 1), "dp_adam_images": big}

    if device.startswith("cuda"):
        plan = [(256, 8, 6.0), (1024, 8, 6.0), (1024, 1, 5.0), (2048, 4, 6.0)]
    else:  # a few seconds of a CPU, so the probe itself is testable
        plan = [(8, 2, 1.0)]
    for physical, draws, seconds in plan:
        guarded("dp_step", dp_step(physical, draws, seconds))
    guarded("warmup", warmup)
    guarded("sampling", sampling)
    guarded("classifier", classifier)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    (out / "smoke_probe.json").write_text(json.dumps(doc, indent=2))
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--tiny", action="store_true", help="a small UNet (the test)")
    args = parser.parse_args(argv)
    doc = run(args.out, args.budget_s, tiny=args.tiny)
    return 0 if all(r["status"] in ("ok", "out_of_memory", "skipped") for r in doc["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
