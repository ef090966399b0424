"""What differential privacy costs per training step: DP-SGD versus non-private finetuning.

For each trainable set (``full``, ``attention``, ``lora``) the same pretrained model, the same
examples and the same batch are finetuned twice through the ML core's real entry point,
:func:`dpsynth_ml.train`:

* **DP**: ``FinetuneTraining(privacy=RecordLevel(DpSpec(...)))``, the path every finetune
  job takes: per-example clipping to C by the clipping engine the finetune chooses
  (``dpsynth_ml.dp.choose_engine``: book-keeping for ``full`` and ``lora``, opacus hooks for
  ``attention``; the run records which, from the model's ``extra.dp_engine``), one Gaussian
  draw per logical step, AdamW.
* **non-DP**: :func:`benchmarks.nonprivate_finetune.train_nonprivate` (benchmarks only,
  never reachable from the product): the same trainable set, loss, optimiser and data, the
  plain gradient of the minibatch's mean loss.

The dataset has exactly ``batch`` records and the DP sample rate is q = 1, so every DP step's
Poisson batch IS the whole dataset: both modes process exactly ``batch`` examples per step
in one physical micro-batch (``max_physical_batch_size = batch``) and the only difference is
what DP-SGD adds. (Poisson sampling itself is one ``rand(N)`` per step, negligible.)

Measured per configuration, each in a FRESH subprocess (a peak of one must not mask
another's, and the allocator starts clean):

* step wall time: timestamps from the training hooks (``acquire_steps`` opens the window,
  each ``on_progress`` closes a step); the median over the steps after ``warmup`` steps.
  The process CPU time of the same windows is recorded too: on a shared CPU with one torch
  thread it does not stretch when other work takes the cores, so its ratio is steadier.
  No checkpoint falls inside the window (``checkpoint_every`` = all steps, and the DP run's
  one checkpoint is written after the last ``on_progress``).
* peak memory of the training steps: on CPU the process RSS high-water mark (``VmHWM``; the
  kernel's mark is reset through ``/proc/self/clear_refs`` when the first lease is asked for,
  i.e. after the model is loaded and the data encoded) minus the RSS at that moment.
  tracemalloc would not see torch's allocations. On CUDA ``torch.cuda.max_memory_allocated``
  would be the figure, but the ML core places nothing on a GPU today (see the notes).
* the number of trainable parameters (``TrainingResult.trainable_parameters``).

The figure is the ratio DP / non-DP of the same mode measured in the same run: the two
cores here are shared, absolute seconds are pessimistic, the ratio transfers.

**Engine rows** (issue 17): then, for each trainable set, one row per DP engine of
:data:`benchmarks.engine_cost.ENGINES` (``hooks`` = ``DpSgdEngine``, ``bookkeeping`` =
``BookKeepingEngine``) measured at the engine level by :func:`benchmarks.engine_cost.run_rounds`:
the same preset, batch and trainable set, one logical step (loss, backward, clipping, noise,
AdamW) without data loading or sampling, in interleaved rounds of fresh processes (non-DP,
then each engine); each ratio is the median over ``engine_pairs`` rounds with its min/max
spread, and the best engine per set is named. An engine that does not build is a row saying
why. ``engine_budget_s`` bounds that part (rounds are cut, and the results say so).
A second engine run measures ``full`` with the engine the finetune chooses for it
(book-keeping) at the product's default logical batch (``batch`` x ``logical_micro_batches``
= 256, the default ``expected_batch_size``): the noise is drawn once per logical step, so at
batch 16 it weighs 16 times what it weighs at 256.

Run from the repository root: ``.venv/bin/python -m benchmarks.dp_overhead``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    bench_main,
    device_label,
    fmt,
    reset_peak_rss,
    status_kib,
)

NAME = "dp_overhead"
MODES = ("full", "attention", "lora")

SCALES: dict[str, dict[str, Any]] = {
    # 2 shared CPU cores, under 4 minutes: the "small" preset (3.2M-parameter UNet, 64/128
    # channels, attention at both levels) on 32x32 images = 8x8 latents. ONE torch thread:
    # with the cores oversubscribed by other work, two threads spent most of a step in
    # OpenMP barriers (20 s instead of ~2 s), which says nothing about DP.
    "cpu": {"preset": "small", "image_size": 32, "batch": 16, "warmup": 2, "measured": 8,
            "lora_rank": 4, "threads": 1, "pretrain_records": 64,
            # engine rows: 7 rounds x 3 sets x (non-DP + engines) forked processes, 1-7 s
            # each (about 4 minutes in all on the quiet machine)
            "engine_pairs": 7, "engine_warmup": 2, "engine_measured": 5,
            "engine_budget_s": 900,
            # full at the default logical batch 256 = 16 micro-batches of 16, with the engine
            # the finetune chooses for it: 7 rounds of 2 processes of 8-15 s (about 3 minutes)
            "logical_micro_batches": 16, "logical_pairs": 7, "logical_warmup": 1,
            "logical_measured": 3, "logical_budget_s": 360},
    # a GPU-sized model: the "base" preset (~31M-parameter UNet) on 128x128 images = 32x32
    # latents. Never run: the ML core places nothing on a GPU yet, so today this would run
    # (slowly) on the CPU; see benchmarks/notes/dp_overhead.md.
    "full": {"preset": "base", "image_size": 128, "batch": 64, "warmup": 3, "measured": 20,
             "lora_rank": 8, "threads": None, "pretrain_records": 64,
             "engine_pairs": 7, "engine_warmup": 3, "engine_measured": 10,
             "engine_budget_s": None,
             "logical_micro_batches": 4, "logical_pairs": 7, "logical_warmup": 2,
             "logical_measured": 5, "logical_budget_s": None},
}

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0


# --------------------------------------------------------------------------- child process


class TimingHooks:
    """Training hooks that grant everything and time each logical step.

    ``acquire_steps`` is called before the steps of a lease run and ``on_progress`` after
    each step, so consecutive timestamps bracket exactly one step (sampling, forward,
    backward, clipping and noise where DP, optimiser update).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.step_s: list[float] = []
        self.cpu_s: list[float] = []
        self._last = 0.0
        self._last_cpu = 0.0
        self.rss_before_kib: int | None = None
        self.peak_kib: int | None = None
        self.peak_method = "none"
        self._maxrss_before_kib = 0

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        if start == 0:
            import torch

            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            self.peak_method = "VmHWM (reset)" if reset_peak_rss() else "ru_maxrss"
            self._maxrss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.rss_before_kib = status_kib("VmRSS")
            self._last = time.perf_counter()
            self._last_cpu = time.process_time()
        return count

    def should_stop(self) -> bool:
        return False

    def on_progress(self, step: int, total: int) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        self.step_s.append(now - self._last)
        self.cpu_s.append(cpu - self._last_cpu)
        self._last, self._last_cpu = now, cpu
        if step == total:  # before the DP run's final checkpoint is written
            if self.peak_method.startswith("VmHWM"):
                self.peak_kib = status_kib("VmHWM")
            else:
                self.peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        pass

    def on_private_stats(self, stats: Any) -> None:
        pass


def _child(config: dict[str, Any]) -> dict[str, Any]:
    """Run ONE configuration (mode, dp or not) and return its measurements."""
    import torch
    from dpsynth_ml import DpSpec, FinetuneTraining, RecordLevel, train
    from dpsynth_ml.models.model_io import read_model_info

    from benchmarks.nonprivate_finetune import NonprivateFinetune, train_nonprivate

    if config["threads"]:
        torch.set_num_threads(int(config["threads"]))
    steps = int(config["warmup"]) + int(config["measured"])
    batch = int(config["batch"])
    common: dict[str, Any] = dict(
        image_size=config["image_size"], channels=1, num_classes=10, trainable=config["mode"],
        lora_rank=config["lora_rank"], learning_rate=1e-4, max_physical_batch_size=batch,
        checkpoint_every=steps, label_dropout=0.1)
    hooks = TimingHooks(steps)
    with tempfile.TemporaryDirectory(prefix="dp-overhead-") as out:
        if config["dp"]:
            spec = FinetuneTraining(**common, privacy=RecordLevel(DpSpec(
                noise_multiplier=NOISE_MULTIPLIER, sample_rate=1.0, expected_batch_size=batch,
                max_grad_norm=MAX_GRAD_NORM, steps=steps)))
            result = train(spec, dataset_path=Path(config["data"]), out_dir=Path(out),
                           hooks=hooks, base_model_dir=Path(config["base_model"]),
                           _test_generator=torch.Generator().manual_seed(0))
            dp_engine = str(read_model_info(result.model_dir).extra.get("dp_engine"))
        else:
            dp_engine = None
            result = train_nonprivate(
                NonprivateFinetune(**common, batch_size=batch, epochs=steps),
                dataset_path=Path(config["data"]), out_dir=Path(out), hooks=hooks,
                base_model_dir=Path(config["base_model"]))
    measured = hooks.step_s[int(config["warmup"]):]
    measured_cpu = hooks.cpu_s[int(config["warmup"]):]
    peak_delta = (None if hooks.peak_kib is None or hooks.rss_before_kib is None
                  else max(0, hooks.peak_kib - (hooks.rss_before_kib
                                                if hooks.peak_method.startswith("VmHWM")
                                                else hooks._maxrss_before_kib)))
    out_doc: dict[str, Any] = {
        "mode": config["mode"], "dp": bool(config["dp"]), "dp_engine": dp_engine,
        "steps": result.steps_completed,
        "step_s_median": statistics.median(measured),
        "step_s_min": min(measured), "step_s_max": max(measured),
        "step_s_all": [round(s, 4) for s in hooks.step_s],
        "cpu_s_median": statistics.median(measured_cpu),
        "cpu_s_all": [round(s, 4) for s in hooks.cpu_s],
        "peak_mem_mib": None if peak_delta is None else round(peak_delta / 1024, 1),
        "rss_before_mib": (None if hooks.rss_before_kib is None
                           else round(hooks.rss_before_kib / 1024, 1)),
        "peak_method": hooks.peak_method,
        "trainable_parameters": result.trainable_parameters,
        "total_parameters": result.total_parameters,
        "device": "cpu",
    }
    if torch.cuda.is_available():
        # Only meaningful once the ML core trains on the GPU (today it places nothing there).
        out_doc["cuda_max_memory_allocated_mib"] = round(
            torch.cuda.max_memory_allocated() / 2**20, 1)
    return out_doc


# --------------------------------------------------------------------------- parent


def _write_digits(path: Path, n: int, offset: int) -> Path:
    """``n`` sklearn digits (public, 8x8, upscaled by the loader), from ``offset``."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    idx = np.arange(offset, offset + n) % len(digits.images)
    images = (digits.images[idx] / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    np.savez(path, images=images, labels=digits.target[idx].astype(np.int64),
             class_names=np.array([f"digit {i}" for i in range(10)]))
    return path


def _pretrain(cfg: dict[str, Any], work: Path) -> tuple[Path, dict[str, Any]]:
    """A base model to finetune: one short seeded pretrain on public digits. Its quality
    does not matter for step time or memory, only its architecture does. Reused from the
    pretraining cache (``benchmarks/pretrain_cache.py``) when it was trained before; returns
    the model directory (read-only) and what the results record about the pretraining."""
    from dpsynth_ml import PretrainTraining

    from benchmarks.pretrain_cache import cached_pretrain

    data = _write_digits(work / "public.npz", cfg["pretrain_records"], offset=0)
    spec = PretrainTraining(preset=cfg["preset"], image_size=cfg["image_size"],
                            epochs=1, batch_size=64, learning_rate=1e-3, seed=0)
    pre = cached_pretrain(spec, data, label=f"{NAME}:{cfg['preset']}",
                          scratch_dir=work / "pretrain")
    return pre.model_dir, pre.record()


def _run_child(config: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.dp_overhead", "--one",
                           json.dumps(config)], cwd=ROOT, capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"configuration {config['mode']} dp={config['dp']} failed:\n"
                           f"{proc.stderr[-4000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


def run(scale: str) -> dict[str, Any]:
    """Measure every (mode, dp) configuration of ``scale``; see the module docstring."""
    cfg = SCALES[scale]
    if cfg["threads"]:
        import torch

        torch.set_num_threads(int(cfg["threads"]))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dp-overhead-") as tmp:
        work = Path(tmp)
        base_model, pretrain_cache = _pretrain(cfg, work)
        data = _write_digits(work / "private.npz", cfg["batch"], offset=1000)
        pretrain_s = time.perf_counter() - t0
        runs = []
        for mode in MODES:
            for dp in (False, True):  # adjacent, so both see the same machine load
                config = {**cfg, "mode": mode, "dp": dp, "data": str(data),
                          "base_model": str(base_model)}
                started = time.perf_counter()
                measured = _run_child(config)
                measured["process_wall_s"] = round(time.perf_counter() - started, 1)
                print(f"[{NAME}] {mode:9s} dp={dp!s:5s} step {measured['step_s_median']:.3f} s"
                      f" (cpu {measured['cpu_s_median']:.3f} s)"
                      f"  peak +{measured['peak_mem_mib']} MiB", flush=True)
                runs.append(measured)
    engines = _engine_rows(cfg, scale, micro_batches=1, trainables=MODES,
                           pairs=cfg["engine_pairs"], warmup=cfg["engine_warmup"],
                           measured=cfg["engine_measured"], budget_s=cfg["engine_budget_s"])
    logical = _engine_rows(cfg, scale, micro_batches=cfg["logical_micro_batches"],
                           trainables=("full",), engines=("bookkeeping",),
                           pairs=cfg["logical_pairs"],
                           warmup=cfg["logical_warmup"], measured=cfg["logical_measured"],
                           budget_s=cfg["logical_budget_s"])
    modes: dict[str, Any] = {}
    for mode in MODES:
        plain, private = (next(r for r in runs if r["mode"] == mode and r["dp"] == dp)
                          for dp in (False, True))
        modes[mode] = {
            "dp_engine": private.get("dp_engine"),
            "trainable_parameters": private["trainable_parameters"],
            "total_parameters": private["total_parameters"],
            "step_s_nondp": plain["step_s_median"], "step_s_dp": private["step_s_median"],
            "time_ratio": private["step_s_median"] / plain["step_s_median"],
            "cpu_s_nondp": plain["cpu_s_median"], "cpu_s_dp": private["cpu_s_median"],
            "cpu_ratio": private["cpu_s_median"] / plain["cpu_s_median"],
            "peak_mem_mib_nondp": plain["peak_mem_mib"], "peak_mem_mib_dp": private["peak_mem_mib"],
            "mem_ratio": (private["peak_mem_mib"] / plain["peak_mem_mib"]
                          if plain["peak_mem_mib"] and private["peak_mem_mib"] is not None
                          else None),
        }
    return {
        "settings": {k: cfg[k] for k in ("preset", "image_size", "batch", "warmup", "measured",
                                         "lora_rank", "threads")}
        | {"noise_multiplier": NOISE_MULTIPLIER, "max_grad_norm": MAX_GRAD_NORM,
           "sample_rate": 1.0, "dataset": "sklearn digits (public), batch-sized",
           "path": "dpsynth_ml.train (DP: the finetune's chosen clipping engine, "
                   "modes[*].dp_engine); non-DP: benchmarks.nonprivate_finetune",
           "timing": "median step wall time (and process CPU time) after warm-up, from "
                     "the training hooks",
           "memory": "RSS high-water delta over the training steps, fresh process each"},
        "pretrain_s": round(pretrain_s, 1),  # this run's (a cache hit: the reuse only)
        "pretrain_cache": pretrain_cache,
        "modes": modes,
        "runs": runs,
        "engines": engines,
        "engines_logical": logical,
    }


def _engine_rows(cfg: dict[str, Any], scale: str, *, micro_batches: int,
                 trainables: tuple[str, ...], pairs: int, warmup: int, measured: int,
                 budget_s: float | None,
                 engines: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Engine rows: ``python -m benchmarks.engine_cost run`` at this scale's preset, batch
    and the given trainable sets, ``micro_batches`` micro-batches per logical step (CUDA when
    torch sees it), in its own process (its children are forked from a parent that has run
    no torch operation, which this one has), with the compact per-process rows."""
    import torch

    from benchmarks.engine_cost import read_rows

    settings = {"device": "cuda" if torch.cuda.is_available() else "cpu",
                "preset": cfg["preset"], "image_size": cfg["image_size"],
                "batch": cfg["batch"], "micro_batches": micro_batches, "warmup": warmup,
                "measured": measured, "pairs": pairs,
                "lora_rank": cfg["lora_rank"], "threads": cfg["threads"],
                "profile": f"dp_overhead:{scale}"}
    command = [sys.executable, "-m", "benchmarks.engine_cost", "run", "--settings",
               json.dumps(settings), "--trainables", ",".join(trainables)]
    if engines:
        command += ["--engines", ",".join(engines)]
    if budget_s:
        command += ["--budget-s", str(budget_s)]
    with tempfile.TemporaryDirectory(prefix="engine-cost-") as out:
        subprocess.run([*command, "--out", out], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
        summary: dict[str, Any] = json.loads((Path(out) / "engine_summary.json").read_text())
        rows = read_rows(Path(out) / "engine_rows.jsonl")
    keep = ("round", "trainable", "engine", "status", "step_s_median", "cpu_s_median",
            "peak_mem_mib", "process_wall_s", "reason")
    summary["rows"] = [{k: r[k] for k in keep if k in r} for r in rows]
    return summary


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def table_markdown(results: dict[str, Any]) -> str:
    """The docs table: one row per trainable set, DP and non-DP side by side."""
    res = results.get("results", results)
    machine = results.get("machine", {})
    s = res["settings"]
    threads = f", {s['threads']} torch thread(s)" if s.get("threads") else ""
    lines = [
        f"Preset `{s['preset']}`, {s['image_size']}x{s['image_size']} images, batch "
        f"{s['batch']} (one micro-batch), median of {s['measured']} steps after "
        f"{s['warmup']} warm-up steps{threads}; "
        f"{device_label(machine) if machine else 'CPU'}. Step time is wall clock; on the "
        "shared CPU the process CPU time per step is the steadier figure (other work on the "
        "cores stretches wall time, not CPU time). Memory is the RSS high-water mark of the "
        "training steps above the RSS before them, each configuration in a fresh process.",
        "",
        "| trainable | trainable params | non-DP step (s) | DP step (s) | time DP/non-DP "
        "| **CPU time DP/non-DP** | non-DP peak (MiB) | DP peak (MiB) | **memory DP/non-DP** |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, m in res["modes"].items():
        cpu_ratio = m.get("cpu_ratio")
        engine = f" ({m['dp_engine']})" if m.get("dp_engine") else ""
        lines.append(
            f"| `{mode}`{engine} | {m['trainable_parameters']:,} | {fmt(m['step_s_nondp'])} | "
            f"{fmt(m['step_s_dp'])} | {_ratio(m['time_ratio'])} | "
            f"**{_ratio(cpu_ratio)}** | "
            f"{fmt(m['peak_mem_mib_nondp'])} | {fmt(m['peak_mem_mib_dp'])} | "
            f"**{_ratio(m['mem_ratio'])}** |")
    for key in ("engines", "engines_logical"):
        if res.get(key):
            lines += ["", *_engine_table(res[key])]
    return "\n".join(lines) + "\n"


def _spread(entry: dict[str, Any] | None) -> str:
    """``median [min–max]`` of a ratio spread, or an em dash."""
    if not entry:
        return "—"
    return f"{entry['median']:.2f}x [{entry['min']:.2f}–{entry['max']:.2f}]"


def _engine_table(engines: dict[str, Any]) -> list[str]:
    """The engine rows: one per (trainable set, engine), the best engine of each set in bold."""
    s = engines.get("settings", {})
    cut = " (cut by the time budget)" if engines.get("cut") else ""
    micro = int(s.get("micro_batches", 1))
    shape = (f"one micro-batch of {s.get('batch')}" if micro == 1 else
             f"a logical batch of {micro * int(s.get('batch', 0))} = {micro} micro-batches of "
             f"{s.get('batch')}, one noise draw")
    lines = [
        f"Per engine, at the engine level (one logical step on {shape}, no data loading; "
        f"{s.get('device')}): each ratio is the median "
        f"over interleaved DP / non-DP pairs of fresh processes, [min–max] over the pairs; "
        f"{engines.get('rounds_done')} rounds of {s.get('pairs')}{cut}. "
        "**Bold**: the best engine of the set (lowest median time ratio).",
        "",
        "| trainable | engine | pairs | time DP/non-DP | CPU time DP/non-DP "
        "| memory DP/non-DP | meets issue-17 aim |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for trainable, t in engines.get("trainables", {}).items():
        best = (t.get("best") or {}).get("engine")
        for engine, e in t["engines"].items():
            name = f"**`{engine}`**" if engine == best else f"`{engine}`"
            if e.get("time_ratio") is None:
                why = str(e.get("reason") or e.get("status"))[:120].replace("|", "/")
                lines.append(f"| `{trainable}` | {name} | 0 | {e.get('status')}: {why} "
                             "| — | — | — |")
                continue
            aim = {True: "yes", False: "no", None: "—"}[e.get("meets_target")]
            lines.append(f"| `{trainable}` | {name} | {e['pairs']} | "
                         f"{_spread(e['time_ratio'])} | {_spread(e.get('cpu_ratio'))} | "
                         f"{_spread(e.get('mem_ratio'))} | {aim} |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
    else:
        bench_main(NAME, run)
