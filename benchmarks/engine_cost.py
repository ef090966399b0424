"""What each DP engine costs per logical step, against non-private training of the same step.

``dp_overhead.py`` measures DP through the product's entry point (:func:`dpsynth_ml.train`),
data loading and Poisson sampling included. This harness isolates the ENGINE: for one
trainable set (``full``, ``attention``, ``lora``) of a preset, it builds the UNet and class
embedder (:mod:`dpsynth_ml.models.architectures`), selects the trainable parameters with the
core's own :func:`dpsynth_ml.models.trainable.apply_trainable`, draws ``micro_batches``
(default 1) micro-batches of random latents and labels of size ``batch`` on the device, and
times one logical step of ``batch * micro_batches`` examples:

* ``nondp``: the trainer's per-example diffusion loss
  (:func:`dpsynth_ml.training.diffusion.per_sample_diffusion_loss`), the plain backward of
  its mean over the logical batch (accumulated over the micro-batches), AdamW;
* each DP engine of :data:`ENGINES` (``hooks`` = :class:`dpsynth_ml.dp.DpSgdEngine`, opacus
  per-sample gradients; ``bookkeeping`` = ``dpsynth_ml.dp.bookkeeping.BookKeepingEngine``
  where it imports): the same loss through ``engine.module``, then what the finetune loop
  does per step: ``accumulate_draws`` (per-example clipping) per micro-batch, then once
  ``privatize`` (one noise draw, divided by the expected batch size) and ``apply_update``
  (AdamW).

The noise is drawn once per logical step whatever its size, so its share falls as the
logical batch grows: ``--micro-batches 16`` with ``--batch 16`` measures the product's
default expected batch of 256 (``FinetuneJobSpec.expected_batch_size``).

Each configuration runs in a FRESH process: one peak must not mask another, and the allocator
starts clean. By default the parent imports torch, diffusers and the ML core once and FORKS a
child per configuration (:class:`Launcher`; the imports alone take ~4 s of a ~5 s process
here); ``--launcher spawn`` starts a new interpreter each time instead (``python -m
benchmarks.engine_cost --one '<json>'`` prints one JSON line), and a forked child that cannot
initialise CUDA switches the run to that. Both run the same :func:`measure_one`. Measured,
after ``warmup`` untimed steps: the median wall time of ``measured`` steps (CUDA synchronised
before each clock read), their process CPU time, and the peak memory of all the steps: on
CUDA ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (weights
included: what limits the batch on a GPU); on the CPU the RSS high-water mark (``VmHWM``,
reset through ``/proc/self/clear_refs``) above the RSS before the first step (the resident
libraries would otherwise dilute the ratio).

The parent runs ROUNDS, interleaved so that every engine's ratio compares processes that saw
the same machine load: for round r = 1..pairs, for each trainable set, ``nondp`` then each
engine still available for it. The ratio of an engine in round r is its figure over that
round's ``nondp`` figure; the summary gives, per (trainable set, engine), the median over the
rounds with its min/max spread (CPU-time ratios moved +-30% between repeats on the shared
2-core machine), and per trainable set the best engine (lowest median time ratio). An engine
that does not import or construct, or fails a step, is recorded once as a row with
``status`` ``unavailable`` / ``failed`` and a ``reason``, and skipped afterwards: the
harness never crashes on an engine.

Everything is written as it happens (``engine_rows.jsonl``, one line per process, and
``engine_summary.json`` after each), so a run cut by a time limit still leaves its data;
``--budget-s`` stops before a process that would not finish in time. ``scripts/
device_check.sh`` runs it under a hard total limit.

Run from the repository root::

    .venv/bin/python -m benchmarks.engine_cost run --out /tmp/engines --profile cpu
    .venv/bin/python -m benchmarks.engine_cost summarize --out /tmp/engines
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, machine_info, reset_peak_rss, status_kib

TRAINABLES = ("full", "attention", "lora")
NONDP = "nondp"

#: The DP engines measured: name -> (module, class). Each must have DpSgdEngine's
#: constructor and methods; one that does not import is reported, not fatal.
ENGINES: dict[str, tuple[str, str]] = {
    "hooks": ("dpsynth_ml.dp.engine", "DpSgdEngine"),
    "bookkeeping": ("dpsynth_ml.dp.bookkeeping", "BookKeepingEngine"),
}

#: Sizes of a run. ``tiny``: the test path on the CPU (seconds per process). ``cpu``: the
#: 2-core machine, the "small" preset and one torch thread as in dp_overhead.py. ``gpu``: the
#: ~31M-parameter "base" preset on 32x32 latents (128x128 images) with a large physical batch.
PROFILES: dict[str, dict[str, Any]] = {
    "tiny": {"device": "cpu", "preset": "tiny", "image_size": 16, "batch": 4, "warmup": 1,
             "measured": 2, "pairs": 2, "lora_rank": 4, "threads": 1},
    "cpu": {"device": "cpu", "preset": "small", "image_size": 32, "batch": 16, "warmup": 2,
            "measured": 5, "pairs": 7, "lora_rank": 4, "threads": 1},
    "gpu": {"device": "cuda", "preset": "base", "image_size": 128, "batch": 64, "warmup": 3,
            "measured": 10, "pairs": 7, "lora_rank": 8, "threads": None},
}

#: The aims of issue 17 (DP / non-DP), per device type: time ratio and memory ratio.
TARGETS: dict[str, dict[str, dict[str, float]]] = {
    "cuda": {"full": {"time": 1.3, "memory": 1.2}, "attention": {"time": 1.1},
             "lora": {"time": 1.1}},
    "cpu": {"full": {"time": 1.8, "memory": 1.5}},
}

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
NUM_CLASSES = 10
ROWS_FILE = "engine_rows.jsonl"
SUMMARY_FILE = "engine_summary.json"
#: Third-party distributions the harness imports, directly (torch, diffusers, opacus,
#: peft, numpy) or through them (reported in device.json).
PACKAGES = ("torch", "diffusers", "opacus", "peft", "numpy", "scipy", "transformers",
            "accelerate", "huggingface_hub", "safetensors")


# --------------------------------------------------------------------------- child process


def load_engine(name: str) -> type[Any]:
    """The engine class registered as ``name`` (ImportError/AttributeError if it is absent)."""
    module, attribute = ENGINES[name]
    cls: type[Any] = getattr(importlib.import_module(module), attribute)
    return cls


def _build(config: dict[str, Any]) -> tuple[Any, Any, list[Any], Any]:
    """The denoiser with the config's trainable set selected, on the config's device.

    Returns:
        (denoiser, scheduler, trainable parameters, device).
    """
    import torch
    from dpsynth_ml.models.architectures import (
        ConditionalDenoiser,
        ModelBundle,
        build_class_embedder,
        build_scheduler,
        build_unet,
        preset_config,
        vae_downsample_factor,
    )
    from dpsynth_ml.models.trainable import apply_trainable
    from dpsynth_ml.spec import FinetuneRecipe
    from torch import nn

    cfg = preset_config(config["preset"])
    latent_size = int(config["image_size"]) // vae_downsample_factor(cfg)
    unet = build_unet(cfg, latent_size=latent_size)
    embedder = build_class_embedder(NUM_CLASSES, cfg.cross_attention_dim)
    # No step touches the VAE (the latents are drawn directly) and apply_trainable only
    # freezes it: an empty module stands in, so a process does not build a VAE it never runs.
    bundle = ModelBundle(vae=nn.Module(), unet=unet,  # type: ignore[arg-type]
                         class_embedder=embedder, scheduler=build_scheduler())
    recipe = FinetuneRecipe(image_size=int(config["image_size"]), channels=1,
                            num_classes=NUM_CLASSES, trainable=config["trainable"],
                            lora_rank=int(config["lora_rank"]), learning_rate=1e-4,
                            max_physical_batch_size=int(config["batch"]))
    names = apply_trainable(bundle, recipe)
    device = torch.device(config["device"])
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).train().to(device)
    named = dict(denoiser.named_parameters())
    return denoiser, bundle.scheduler, [named[n] for n in names], device


def _step_fn(config: dict[str, Any]) -> tuple[Callable[[], None], int]:
    """Build everything of one configuration and return (one logical step, trainable count).

    Raises whatever building the engine raises (the caller reports it as ``unavailable``).
    """
    import torch
    from dpsynth_ml.training.diffusion import drop_labels, per_sample_diffusion_loss

    denoiser, scheduler, params, device = _build(config)
    batch = int(config["batch"])
    micro = int(config.get("micro_batches", 1))
    data_gen = torch.Generator().manual_seed(int(config.get("seed", 0)))
    cfg_latent = int(denoiser.latent_channels)
    size = int(denoiser.unet.config["sample_size"])
    latents = [torch.randn((batch, cfg_latent, size, size), generator=data_gen).to(device)
               for _ in range(micro)]
    labels = [torch.randint(0, NUM_CLASSES, (batch,), generator=data_gen)
              for _ in range(micro)]
    generator = torch.Generator().manual_seed(1)  # timesteps and noise, as the trainer's
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    count = sum(p.numel() for p in params)

    def step_labels(index: int) -> Any:
        return drop_labels(labels[index], probability=0.1, null_class=NUM_CLASSES,
                           generator=generator).to(device)

    if config["engine"] == NONDP:
        def plain_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            for index in range(micro):
                losses = per_sample_diffusion_loss(denoiser, scheduler, latents[index],
                                                   step_labels(index), generator)
                (losses.sum() / (batch * micro)).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return plain_step, count

    engine = load_engine(config["engine"])(
        denoiser, optimizer, noise_multiplier=NOISE_MULTIPLIER, max_grad_norm=MAX_GRAD_NORM,
        expected_batch_size=batch * micro)

    def dp_step() -> None:
        for index in range(micro):
            step_labels_ = step_labels(index)

            def draw(index: int = index, step_labels_: Any = step_labels_) -> Any:
                return per_sample_diffusion_loss(engine.module, scheduler, latents[index],
                                                 step_labels_, generator)

            engine.accumulate_draws(draw, 1)
        engine.privatize()
        engine.apply_update()

    return dp_step, count


def measure_one(config: dict[str, Any]) -> dict[str, Any]:
    """Run ONE configuration in this process and return its row (never raises).

    Args:
        config: ``engine`` (``nondp`` or a name of :data:`ENGINES`), ``trainable``,
            ``device``, ``preset``, ``image_size``, ``batch``, ``warmup``, ``measured``,
            ``lora_rank``, ``threads``.

    Returns:
        The row: ``status`` ``ok`` with the step figures, ``unavailable`` (the engine did
        not import or construct) or ``failed`` (a step raised), with a ``reason``.
    """
    import torch

    row: dict[str, Any] = {"engine": config["engine"], "trainable": config["trainable"],
                           "device": config["device"]}
    if config.get("threads"):
        torch.set_num_threads(int(config["threads"]))
    try:
        step, count = _step_fn(config)
    except Exception as exc:  # noqa: BLE001  # an engine that cannot be built is a finding
        return row | {"status": "unavailable" if config["engine"] != NONDP else "failed",
                      "reason": f"{type(exc).__name__}: {exc}"[:500],
                      "traceback": traceback.format_exc()[-2000:]}
    cuda = config["device"].startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base_bytes = torch.cuda.memory_allocated()
    peak_method = "VmHWM (reset)" if reset_peak_rss() else "none"
    rss_before = status_kib("VmRSS")
    walls: list[float] = []
    cpus: list[float] = []
    try:
        for _ in range(int(config["warmup"]) + int(config["measured"])):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            sync()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    except Exception as exc:  # noqa: BLE001  # e.g. out of memory: report it as a row
        return row | {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500],
                      "traceback": traceback.format_exc()[-2000:], "steps_done": len(walls)}
    if cuda:
        peak_mib: float | None = torch.cuda.max_memory_allocated() / 2**20
        row["peak_delta_mib"] = round((torch.cuda.max_memory_allocated() - base_bytes)
                                      / 2**20, 1)
        peak_method = "torch.cuda.max_memory_allocated"
    else:
        hwm = status_kib("VmHWM") if peak_method != "none" else None
        peak_mib = (None if hwm is None or rss_before is None
                    else max(0, hwm - rss_before) / 1024)
    measured, measured_cpu = walls[int(config["warmup"]):], cpus[int(config["warmup"]):]
    return row | {
        "status": "ok",
        "step_s_median": statistics.median(measured),
        "step_s_min": min(measured), "step_s_max": max(measured),
        "cpu_s_median": statistics.median(measured_cpu),
        "step_s_all": [round(s, 5) for s in walls],
        "peak_mem_mib": None if peak_mib is None else round(peak_mib, 1),
        "peak_method": peak_method,
        "rss_before_mib": None if rss_before is None else round(rss_before / 1024, 1),
        "trainable_parameters": count,
        "batch": int(config["batch"]),
        "micro_batches": int(config.get("micro_batches", 1)),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
    }


# --------------------------------------------------------------------------- summary


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, min, max and count of ``values``; None when there are none."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return float(numerator) / float(denominator)


def summarize_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per (trainable set, engine) ratios over the rounds, and the best engine per set.

    A round contributes a pair when both its ``nondp`` row and the engine's row are ``ok``;
    each ratio (time, CPU time, memory) is taken within the pair, then the median over pairs
    is reported with its min/max spread. The best engine of a set is the one with the lowest
    median wall-time ratio (ties: the lower memory ratio).

    Args:
        rows: rows as :func:`measure_one` returns them, with ``round`` added by the parent.

    Returns:
        ``{"trainables": {set: {"engines": {engine: ...}, "best": ... | None}}, "device"}``.
    """
    devices = {r.get("device", "cpu") for r in rows if r.get("status") == "ok"}
    device = "cuda" if any(str(d).startswith("cuda") for d in devices) else "cpu"
    trainables: dict[str, Any] = {}
    order = [t for t in TRAINABLES if any(r.get("trainable") == t for r in rows)]
    order += sorted({str(r.get("trainable")) for r in rows} - set(order))
    for trainable in order:
        mine = [r for r in rows if r.get("trainable") == trainable]
        plain = {r.get("round"): r for r in mine if r["engine"] == NONDP
                 and r.get("status") == "ok"}
        engines: dict[str, Any] = {}
        names = [e for e in ENGINES if any(r["engine"] == e for r in mine)]
        names += sorted({r["engine"] for r in mine} - set(names) - {NONDP})
        for engine in names:
            theirs = [r for r in mine if r["engine"] == engine]
            bad = [r for r in theirs if r.get("status") != "ok"]
            pairs = [(plain[r.get("round")], r) for r in theirs
                     if r.get("status") == "ok" and r.get("round") in plain]
            entry: dict[str, Any] = {"pairs": len(pairs)}
            if bad:
                entry["status"] = bad[0].get("status")
                entry["reason"] = bad[0].get("reason")
            elif not pairs:
                entry["status"] = "no pair"
            else:
                entry["status"] = "ok"
            for key, field in (("time_ratio", "step_s_median"), ("cpu_ratio", "cpu_s_median"),
                               ("mem_ratio", "peak_mem_mib")):
                ratios = [x for x in (_ratio(d.get(field), n.get(field)) for n, d in pairs)
                          if x is not None]
                entry[key] = spread(ratios)
            for key, field in (("step_s", "step_s_median"), ("cpu_s", "cpu_s_median"),
                               ("peak_mem_mib", "peak_mem_mib")):
                for side, index in (("nondp", 0), ("dp", 1)):
                    values = [p[index][field] for p in pairs if p[index].get(field) is not None]
                    entry[f"{key}_{side}"] = statistics.median(values) if values else None
            if pairs:
                entry["trainable_parameters"] = pairs[0][1].get("trainable_parameters")
            entry["meets_target"] = meets_target(device, trainable, entry)
            engines[engine] = entry
        measured = {e: v for e, v in engines.items() if v["time_ratio"] is not None}
        best = None
        if measured:
            name = min(measured, key=lambda e: (
                measured[e]["time_ratio"]["median"],
                (measured[e]["mem_ratio"] or {}).get("median", float("inf"))))
            best = {"engine": name, "time_ratio": measured[name]["time_ratio"]["median"],
                    "cpu_ratio": (measured[name]["cpu_ratio"] or {}).get("median"),
                    "mem_ratio": (measured[name]["mem_ratio"] or {}).get("median"),
                    "meets_target": measured[name]["meets_target"]}
        trainables[trainable] = {"nondp_runs": len(plain), "engines": engines, "best": best}
    return {"device": device, "targets": TARGETS.get(device, {}), "trainables": trainables}


def meets_target(device: str, trainable: str, entry: dict[str, Any]) -> bool | None:
    """Whether an engine's median ratios meet issue 17's aim for ``trainable`` on ``device``.

    On CUDA the wall-time ratio is judged; on the (shared) CPU the CPU-time ratio, which
    other work on the cores does not stretch. None when there is no aim or no measurement.
    """
    aim = TARGETS.get(device, {}).get(trainable)
    if not aim:
        return None
    time_key = "time_ratio" if device == "cuda" else "cpu_ratio"
    verdicts = []
    for what, key in (("time", time_key), ("memory", "mem_ratio")):
        if what in aim:
            got = entry.get(key)
            if got is None:
                return None
            verdicts.append(got["median"] <= aim[what])
    return all(verdicts)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an ``engine_rows.jsonl`` (a line cut by a kill is skipped)."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)  # never a half-written file, even when killed


def human_summary(summary: dict[str, Any]) -> str:
    """A few lines for the terminal: per trainable set, each engine's median ratios."""
    settings = summary.get("settings") or {}
    shape = (f", logical batch {settings['batch']} x {settings.get('micro_batches', 1)}"
             if "batch" in settings else "")
    lines = [f"engine step cost on {summary.get('device')}{shape} (DP / non-DP, median "
             "[min-max] over pairs)"]
    for trainable, t in summary.get("trainables", {}).items():
        for engine, e in t["engines"].items():
            if e["time_ratio"] is None:
                lines.append(f"  {trainable:9s} {engine:12s} {e.get('status')}: "
                             f"{e.get('reason') or ''}"[:160])
                continue
            tr, cr, mr = e["time_ratio"], e["cpu_ratio"], e["mem_ratio"]
            mem = "n/a" if mr is None else (f"{mr['median']:.2f}x "
                                            f"[{mr['min']:.2f}-{mr['max']:.2f}]")
            cpu = "" if cr is None else f" cpu {cr['median']:.2f}x"
            lines.append(f"  {trainable:9s} {engine:12s} time {tr['median']:.2f}x "
                         f"[{tr['min']:.2f}-{tr['max']:.2f}]{cpu} mem {mem} "
                         f"pairs {e['pairs']} target {e['meets_target']}")
        if t["best"]:
            lines.append(f"  {trainable:9s} best: {t['best']['engine']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- parent


def _child_env() -> dict[str, str]:
    """The environment of a child: this one, with the source trees importable uninstalled."""
    paths = [str(ROOT / "shared" / "src"), str(ROOT / "services" / "worker" / "src"), str(ROOT)]
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONWARNINGS": "ignore",
            "PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}


def run_child(config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Measure one configuration in a fresh ``python -m benchmarks.engine_cost --one``.

    Never raises: a crash or a timeout comes back as a row with ``status`` ``error`` or
    ``timeout``.
    """
    started = time.perf_counter()
    base = {"engine": config["engine"], "trainable": config["trainable"],
            "device": config["device"]}
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.engine_cost", "--one",
                               json.dumps(config)], cwd=ROOT, capture_output=True, text=True,
                              check=False, env=_child_env(), timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        row = base | {"status": "timeout", "reason": f"no result within {timeout_s:.0f} s"}
    else:
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            row = json.loads(lines[-1])
        else:
            row = base | {"status": "error", "reason": f"exit {proc.returncode}: "
                                                       f"{proc.stderr[-1500:]}"}
    row["process_wall_s"] = round(time.perf_counter() - started, 2)
    row["launcher"] = "spawn"
    return row


def preload() -> None:
    """Import, in the parent, what every child imports, so that a forked child starts warm.

    Only imports: the parent must run no torch operation (a forked child of a process whose
    OpenMP pool exists can hang) and never touch CUDA (a child of a process that initialised
    the driver cannot use it); ``PYTORCH_NVML_BASED_CUDA_CHECK`` keeps even a stray
    ``torch.cuda.is_available()`` from initialising it. An engine that does not import is
    left to the child, which reports it.
    """
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for module in ("torch", "dpsynth_ml.training.diffusion", "dpsynth_ml.models.trainable",
                   "dpsynth_ml.models.architectures", "peft",
                   *(m for m, _ in ENGINES.values())):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001, S112  # the child reports what does not import
            continue


def fork_child(config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Measure one configuration in a fresh FORKED process (after :func:`preload`).

    The same :func:`measure_one` as ``--one``, without paying the ~4 s of imports (torch,
    diffusers) per process again: the child is a new process with its own allocator
    state from here on and its own RSS high-water mark (reset before its steps), and it
    exits after one configuration. Never raises: a crash or a timeout is a row.
    """
    import signal
    import tempfile

    started = time.perf_counter()
    base = {"engine": config["engine"], "trainable": config["trainable"],
            "device": config["device"]}
    fd, name = tempfile.mkstemp(prefix="engine-cost-", suffix=".json")
    os.close(fd)
    result = Path(name)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: measure, write the row, leave without running the parent's exit
        code = 0
        try:
            result.write_text(json.dumps(measure_one(config)))
        except BaseException:  # noqa: BLE001  # measure_one never raises; belt and braces
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + max(1.0, timeout_s)
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        else:
            time.sleep(0.02)
    text = result.read_text() if result.exists() else ""
    result.unlink(missing_ok=True)
    if status is None:
        row = base | {"status": "timeout", "reason": f"no result within {timeout_s:.0f} s"}
    elif text:
        row = json.loads(text)
    else:
        row = base | {"status": "error", "reason": f"child ended without a row "
                                                   f"(wait status {status})"}
    row["process_wall_s"] = round(time.perf_counter() - started, 2)
    row["launcher"] = "fork"
    return row


class Launcher:
    """Starts the fresh process of each configuration: ``fork`` (after :func:`preload`) or
    ``spawn`` (``python -m benchmarks.engine_cost --one``).

    A forked child that cannot initialise CUDA (the parent must never have touched it, but a
    library's import might) switches this launcher to ``spawn`` for the rest of the run and
    measures that configuration again.
    """

    def __init__(self, mode: str) -> None:
        if mode not in ("fork", "spawn"):
            raise ValueError(f"unknown launcher {mode!r}")
        self.mode = mode if hasattr(os, "fork") else "spawn"
        if self.mode == "fork":
            preload()

    def __call__(self, config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.mode == "spawn":
            return run_child(config, timeout_s)
        started = time.monotonic()
        row = fork_child(config, timeout_s)
        reason = str(row.get("reason", "")).lower()
        if row.get("status") != "ok" and config["device"].startswith("cuda") and (
                "forked" in reason or "initialization error" in reason):
            print(f"[engine_cost] CUDA unusable in a forked child ({reason[:120]}); "
                  "spawning fresh interpreters from now on", flush=True)
            self.mode = "spawn"
            return run_child(config, timeout_s - (time.monotonic() - started))
        return row


def run_rounds(settings: dict[str, Any], out: Path, *, trainables: Sequence[str],
               engines: Sequence[str], budget_s: float | None = None,
               child: Callable[[dict[str, Any], float], dict[str, Any]] = run_child,
               clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Interleaved rounds of fresh processes; rows and summary written as they come.

    Args:
        settings: a :data:`PROFILES` entry (``pairs`` = rounds).
        out: folder for ``engine_rows.jsonl`` (started empty, then one line appended per
            process) and ``engine_summary.json``.
        trainables: the trainable sets.
        engines: the DP engines (names of :data:`ENGINES`).
        budget_s: stop before a process that would not end within this many seconds of the
            start (its estimate: the slowest process of the same kind so far, x1.2).
        child: measures one configuration (tests inject a fake).
        clock: seconds for the budget (tests inject a fake).

    Returns:
        The summary (also written to ``engine_summary.json``), with ``rounds_done`` and
        ``cut`` (True when the budget stopped it early).
    """
    out.mkdir(parents=True, exist_ok=True)
    rows_path, start = out / ROWS_FILE, clock()
    deadline = None if budget_s is None else start + budget_s
    dropped: set[tuple[str, str]] = set()  # (trainable, engine) that failed once
    slowest: dict[tuple[str, str], float] = {}
    rows_path.write_text("")  # this run's rows only; each line is appended as it comes
    rows: list[dict[str, Any]] = []
    rounds_done, cut = 0, False
    fields = ("device", "preset", "image_size", "batch", "warmup", "measured", "lora_rank",
              "threads")
    settings.setdefault("micro_batches", 1)
    for round_index in range(int(settings["pairs"])):
        for trainable in trainables:
            for engine in [NONDP, *engines]:
                if (trainable, engine) in dropped:
                    continue
                kind = (trainable, engine)
                left = None if deadline is None else deadline - clock()
                guess = slowest.get(kind, max(slowest.values(), default=0.0)) * 1.2
                if left is not None and left < max(guess, 1.0):
                    cut = True
                    break
                config = {k: settings[k] for k in fields} | {
                    "micro_batches": settings["micro_batches"], "engine": engine,
                    "trainable": trainable, "seed": round_index}
                row = child(config, left if left is not None else 3600.0)
                row["round"] = round_index
                slowest[kind] = max(slowest.get(kind, 0.0), float(row.get("process_wall_s", 0)))
                with rows_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                rows.append(row)
                if row.get("status") != "ok":
                    dropped.add(kind)
                    if engine == NONDP:  # no baseline: nothing of this set can be compared
                        dropped.update((trainable, e) for e in engines)
                _print_row(row)
                summary = summarize_rows(rows) | {"settings": settings, "cut": cut,
                                                  "rounds_done": rounds_done}
                _write_json(out / SUMMARY_FILE, summary)
            if cut:
                break
        if cut:
            break
        rounds_done += 1
    summary = summarize_rows(rows) | {"settings": settings, "cut": cut,
                                      "rounds_done": rounds_done,
                                      "wall_s": round(clock() - start, 1)}
    _write_json(out / SUMMARY_FILE, summary)
    return summary


def _print_row(row: dict[str, Any]) -> None:
    if row.get("status") == "ok":
        print(f"[engine_cost] r{row['round']} {row['trainable']:9s} {row['engine']:12s} "
              f"step {row['step_s_median']:.4f} s cpu {row['cpu_s_median']:.4f} s "
              f"peak {row['peak_mem_mib']} MiB ({row['process_wall_s']} s)", flush=True)
    else:
        print(f"[engine_cost] r{row['round']} {row['trainable']:9s} {row['engine']:12s} "
              f"{row['status']}: {str(row.get('reason'))[:200]}", flush=True)


def resolve_profile(name: str) -> str:
    """``auto``: ``gpu`` when torch sees CUDA, else ``cpu``; any other name as given."""
    if name != "auto":
        return name
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- device


def device_info() -> dict[str, Any]:
    """The machine for ``device.json``: host, GPUs (nvidia-smi), Python, packages, torch.

    Never raises: each part that cannot be read says why.
    """
    info: dict[str, Any] = {
        "hostname": socket.gethostname(), "python": sys.version.split()[0],
        "python_executable": sys.executable, "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for key, args in (("nvidia_smi_L", ["nvidia-smi", "-L"]),
                      ("nvidia_smi_query", ["nvidia-smi", "--query-gpu=name,memory.total",
                                            "--format=csv,noheader"])):
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
            info[key] = proc.stdout.strip().splitlines() if proc.returncode == 0 else None
        except (OSError, subprocess.SubprocessError) as exc:
            info[key] = None
            info[f"{key}_error"] = type(exc).__name__
    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    info["packages"] = packages
    try:
        import torch

        torch_info: dict[str, Any] = {"version": torch.__version__,
                                      "cuda_available": torch.cuda.is_available(),
                                      "cuda": torch.version.cuda, "threads":
                                      torch.get_num_threads()}
        if torch.cuda.is_available():
            torch_info["device_name"] = torch.cuda.get_device_name(0)
            torch_info["device_count"] = torch.cuda.device_count()
            torch_info["memory_gib"] = round(
                torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["torch"] = torch_info
    except Exception as exc:  # noqa: BLE001  # no torch is a finding for device.json
        info["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
    imports: dict[str, str] = {}
    for module in ("dpsynth_ml.dp.engine", *(m for m, _ in ENGINES.values())):
        try:
            importlib.import_module(module)
            imports[module] = "ok"
        except Exception as exc:  # noqa: BLE001
            imports[module] = f"{type(exc).__name__}: {exc}"[:300]
    info["imports"] = imports
    try:  # CPU model, RAM, load average, git commit (and whether the tree was dirty)
        info["machine"] = machine_info()
    except Exception as exc:  # noqa: BLE001
        info["machine"] = {"error": f"{type(exc).__name__}: {exc}"}
    return info


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``--one JSON`` | ``run`` | ``summarize`` | ``device``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--one":
        print(json.dumps(measure_one(json.loads(argv[1]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_cost")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="measure interleaved rounds of fresh processes")
    run_p.add_argument("--out", type=Path, required=True)
    run_p.add_argument("--profile", default="auto", choices=["auto", *PROFILES])
    run_p.add_argument("--settings", default=None,
                       help="a whole PROFILES-like JSON object, in place of --profile")
    run_p.add_argument("--pairs", type=int, default=None, help="rounds (default: profile's)")
    run_p.add_argument("--batch", type=int, default=None)
    run_p.add_argument("--micro-batches", type=int, default=None,
                       help="micro-batches per logical step (default 1; the noise is drawn "
                            "once per logical step)")
    run_p.add_argument("--trainables", default=",".join(TRAINABLES))
    run_p.add_argument("--engines", default=",".join(ENGINES))
    run_p.add_argument("--budget-s", type=float, default=None)
    run_p.add_argument("--launcher", default="fork", choices=["fork", "spawn"],
                       help="how each fresh process starts (default fork: no re-import)")
    run_p.add_argument("--quiet", action="store_true", help="no human summary at the end")
    sum_p = sub.add_parser("summarize", help="summary.json from the rows written so far")
    sum_p.add_argument("--out", type=Path, required=True)
    sum_p.add_argument("--to", type=Path, default=None, help="default: OUT/summary.json")
    dev_p = sub.add_parser("device", help="write the machine description")
    dev_p.add_argument("--to", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "device":
        info = device_info()
        args.to.parent.mkdir(parents=True, exist_ok=True)
        _write_json(args.to, info)
        torch_info = info.get("torch", {})
        print(f"[device] {info['hostname']}: torch {torch_info.get('version')} cuda "
              f"{torch_info.get('cuda_available')} {torch_info.get('device_name', '')}",
              flush=True)
        return 0
    if args.command == "summarize":
        rows = read_rows(args.out / ROWS_FILE)
        summary = summarize_rows(rows)
        previous = args.out / SUMMARY_FILE
        if previous.exists():  # settings, rounds_done and cut of the run, if it got that far
            old = json.loads(previous.read_text())
            summary |= {k: old[k] for k in ("settings", "cut", "rounds_done", "wall_s")
                        if k in old}
        device = args.out / "device.json"
        if device.exists():
            summary["machine"] = json.loads(device.read_text())
        summary["rows"] = len(rows)
        _write_json(args.to or args.out / "summary.json", summary)
        print(human_summary(summary), flush=True)
        return 0
    # before anything imports torch: a CUDA check must not initialise the driver in the
    # parent of forked children
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if args.settings:
        settings = json.loads(args.settings)
        settings.setdefault("profile", "custom")
    else:
        profile = resolve_profile(args.profile)
        settings = dict(PROFILES[profile]) | {"profile": profile}
    if args.pairs is not None:
        settings["pairs"] = args.pairs
    if args.batch is not None:
        settings["batch"] = args.batch
    if args.micro_batches is not None:
        settings["micro_batches"] = args.micro_batches
    summary = run_rounds(settings, args.out,
                         trainables=[t for t in args.trainables.split(",") if t],
                         engines=[e for e in args.engines.split(",") if e],
                         budget_s=args.budget_s, child=Launcher(args.launcher))
    if not args.quiet:
        print(human_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
