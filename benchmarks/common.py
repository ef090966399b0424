"""Shared plumbing of the benchmark scripts: scale, machine description, results files, timing.

Every benchmark is a module ``benchmarks/<name>.py`` with ``run(scale) -> dict`` (the measured
numbers, JSON-serialisable) and ``table_markdown(results) -> str`` (the table that
``render_docs.py`` puts into ``docs/benchmarks.md``), run as ``python -m benchmarks.<name>``.
Its ``__main__`` block calls :func:`bench_main`, which runs it at :data:`SCALE` and writes
``benchmarks/results/<name>.json`` with the machine it ran on and the exact command, so that
every number in the docs can be traced to a run and reproduced.

Why a results file names the machine: a ratio (DP / non-DP step time, submissions/s over the
same run's health-check rate) transfers between machines, an absolute number does not; the docs
print both with the device, and GPU rows only exist when ``machine.device`` says ``cuda``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
NOTES_DIR = ROOT / "benchmarks" / "notes"

Scale = Literal["cpu", "gpu-smoke", "gpu", "full"]
SCALES = ("cpu", "gpu-smoke", "gpu", "full")
SCALE: str = os.environ.get("BENCH_SCALE", "cpu")
"""``cpu``: sized for the 2-core CI machine (all of ``make bench`` in under 30 minutes);
``full``: the paper-sized runs meant for a GPU; ``gpu-smoke`` (minutes on one GPU, part of
``scripts/device_check.sh``) and ``gpu`` (GPU hours): defined by the benchmarks that have
them (``fmnist_no_public``); another benchmark refuses them by name."""

SCALED_FOR_GPU = frozenset({"fmnist_no_public"})
"""The benchmarks that define the ``gpu-smoke`` and ``gpu`` scales."""

if SCALE not in SCALES:
    raise SystemExit(f"BENCH_SCALE must be one of {', '.join(SCALES)}, not {SCALE!r}")


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError):
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _torch_info() -> dict[str, Any]:
    """torch version and the device the benchmarks run on (``cuda`` when one is visible)."""
    try:
        import torch
    except ImportError:
        return {"torch": None, "device": "cpu", "gpu": None}
    info: dict[str, Any] = {"torch": torch.__version__, "device": "cpu", "gpu": None}
    if torch.cuda.is_available():
        info["device"] = "cuda"
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(
            torch.cuda.get_device_properties(0).total_memory / 1024**3, 1
        )
        info["cuda"] = torch.version.cuda
    info["torch_threads"] = torch.get_num_threads()
    return info


def _load_average() -> float | None:
    """1-minute load average when the results are written: on a shared machine a load well
    above the core count means the numbers were measured under contention."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """Describe the machine and code a result came from.

    Returns:
        CPU model, logical cores (and those this process may use), RAM, torch version, the
        device (``cpu``/``cuda``) and GPU name, the 1-minute load average, Python version,
        git commit (with a ``dirty`` flag: uncommitted changes mean the commit alone does not
        reproduce the run) and the UTC date.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "ram_gib": _ram_gib(),
        **_torch_info(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m": _load_average(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def device_label(machine: dict[str, Any]) -> str:
    """One-line name of the device a result was measured on, for table captions."""
    if machine.get("device") == "cuda" and machine.get("gpu"):
        return f"GPU: {machine['gpu']}"
    return f"CPU: {machine.get('cpu', '?')}, {machine.get('cores_usable', '?')} cores"


# --------------------------------------------------------------------------- results


def current_command() -> str:
    """The exact command line of this process, with the scale it ran at.

    ``sys.orig_argv`` keeps ``-m benchmarks.<name>`` (``sys.argv`` would show the file path).
    """
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return f"BENCH_SCALE={SCALE} " + " ".join(shlex.quote(a) for a in argv)


def write_results(
    name: str,
    results: dict[str, Any],
    *,
    command: str | None = None,
    wall_s: float | None = None,
) -> Path:
    """Write ``benchmarks/results/<name>.json``: the numbers, the machine and the command.

    A run on a GPU writes ``<name>.gpu.json`` instead, so the CPU numbers of ``make bench``
    and a measured GPU run sit side by side in the docs (GPU rows exist only from such a file).

    Args:
        name: benchmark name (the module name, e.g. ``"service_load"``).
        results: what ``run`` returned; must be JSON-serialisable.
        command: the command that reproduces it; defaults to this process's command line.
        wall_s: wall time of the whole run, when known.

    Returns:
        The path written.
    """
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    doc = {
        "name": name,
        "scale": SCALE,
        "command": command or current_command(),
        "wall_s": None if wall_s is None else round(wall_s, 1),
        "machine": machine,
        "results": results,
    }
    gpu, why = gpu_label(machine, results)
    if machine.get("device") == "cuda" and not gpu:
        doc["gpu_label_refused"] = why
    path = results_path(name, gpu=gpu)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)  # never leave a half-written file for render_docs
    return path


def recorded_devices(results: Any) -> list[str]:
    """Every device a result records, at any depth: the values of ``device`` keys (strings)
    and of ``devices`` mappings (phase -> device), as the ML core's results report them."""
    found: list[str] = []
    if isinstance(results, dict):
        for key, value in results.items():
            if key == "device" and isinstance(value, str):
                found.append(value)
            elif key == "devices" and isinstance(value, dict):
                found.extend(str(v) for v in value.values())
            else:
                found.extend(recorded_devices(value))
    elif isinstance(results, list):
        for item in results:
            found.extend(recorded_devices(item))
    return found


def gpu_label(machine: dict[str, Any], results: Any) -> tuple[bool, str]:
    """Whether a run may be published as GPU rows: the machine had CUDA AND the run records
    the device of its phases AND every one of them is CUDA (issue 18, item 6: a run on a GPU
    host whose work ran on the CPU is CPU rows). Returns the verdict and why not."""
    if machine.get("device") != "cuda":
        return False, "no CUDA device on the machine"
    devices = [d for d in recorded_devices(results) if not d.startswith("none")]
    if not devices:
        return False, "the results record no device per phase"
    elsewhere = sorted({d for d in devices if not d.startswith("cuda")})
    if elsewhere:
        return False, f"some phases ran elsewhere: {', '.join(elsewhere)}"
    return True, ""


def results_path(name: str, *, gpu: bool = False) -> Path:
    """``benchmarks/results/<name>.json``, or ``<name>.gpu.json`` for a run on a GPU."""
    return RESULTS_DIR / (f"{name}.gpu.json" if gpu else f"{name}.json")


def read_results(name: str, *, gpu: bool = False) -> dict[str, Any] | None:
    """The last results document of ``name`` (of its GPU run), or None if it never ran."""
    path = results_path(name, gpu=gpu)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _json_default(obj: Any) -> Any:
    # numpy scalars/arrays and Paths appear in results; everything else is a bug.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable in benchmark results: {type(obj).__name__}")


def bench_main(name: str, run: Callable[[str], dict[str, Any]]) -> Path:
    """Run one benchmark at :data:`SCALE`, write its results and print where they went.

    Args:
        name: benchmark name (results file stem).
        run: the module's ``run(scale)``.

    Returns:
        The results path.
    """
    if SCALE in ("gpu-smoke", "gpu") and name not in SCALED_FOR_GPU:
        raise SystemExit(f"{name} defines no BENCH_SCALE={SCALE}; it has cpu and full")
    t0 = time.perf_counter()
    results = run(SCALE)
    wall = time.perf_counter() - t0
    path = write_results(name, results, wall_s=wall)
    print(f"[{name}] scale={SCALE} wall={wall:.1f}s -> {path.relative_to(ROOT)}", flush=True)
    return path


# --------------------------------------------------------------------------- memory


def status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``); None where unavailable
    (not Linux, or no such field)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (``VmHWM``) of this process (Linux >= 4.0).

    tracemalloc does not see torch's allocations, and ``ru_maxrss`` cannot be reset: writing
    ``5`` to ``/proc/self/clear_refs`` is the only way to measure the peak of one phase of a
    process on the CPU.

    Returns:
        False where the kernel refused (then only ``ru_maxrss``, the whole life's peak, is
        left).
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------- timing


@dataclass
class Timer:
    """Wall-clock stopwatch (``time.perf_counter``); ``elapsed`` is seconds once stopped."""

    elapsed: float = 0.0
    _start: float = field(default=0.0, repr=False)

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self._start


@contextmanager
def timed(label: str, sink: dict[str, float] | None = None) -> Iterator[Timer]:
    """Time a block; record ``label -> seconds`` into ``sink`` when given.

    Example:
        >>> phases: dict[str, float] = {}
        >>> with timed("warmup", phases):
        ...     pass
    """
    t = Timer()
    with t:
        yield t
    if sink is not None:
        sink[label] = round(t.elapsed, 4)


def time_repeated(
    fn: Callable[[], Any],
    *,
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    Args:
        fn: the work of one step.
        repeats: timed calls.
        warmup: untimed calls first (allocator, autotuning, caches).
        sync: called after each ``fn`` before the clock stops, e.g. ``torch.cuda.synchronize``
            (CUDA calls return before the kernel finishes).

    Returns:
        ``mean_s``, ``median_s``, ``std_s``, ``min_s`` and ``repeats``.
    """
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return summarize(times)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Mean, median, standard deviation and minimum of a list of durations (seconds)."""
    return {
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min_s": min(times),
        "repeats": float(len(times)),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation (numpy's default method)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fmt(value: float | None, digits: int = 3) -> str:
    """Format a number for a markdown table; ``None``/NaN print as an em dash."""
    if value is None or value != value:
        return "—"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
