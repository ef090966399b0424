"""What the ChaCha20 noise source costs per DP step, against opacus' ``torch.normal``.

Times one noise draw of ``n`` float32 values, as the engine makes it once per logical step
(one flat draw for all trainable parameters, ``SourcedNoiseDPOptimizer.add_noise``):

* ``torch.normal``: opacus' non-secure path (Mersenne Twister on the CPU), the old noise;
* ``ChaChaGaussian``: ChaCha20 keystream -> 53-bit uniforms -> Box–Muller (float64) ->
  sum of 4 / 2 -> float32 (``dpsynth_ml.dp.noise``), the noise now, once with each
  implementation of the keystream: ``torch`` (int32 torch kernels, what a GPU runs) and
  ``openssl`` (OpenSSL's ChaCha20 through ``cryptography``, what the CPU runs since issue
  17). Both give the same values.

Sizes: 1M and 10M values, and the trainable-parameter counts of the ``small`` preset's
``full`` / ``attention`` / ``lora`` finetunes, whose DP step CPU times are read from
``benchmarks/results/dp_overhead.json`` (same machine, committed run) to show what the
noise adds to a step. Median process CPU time (the steady figure on a shared CPU) and wall
time of ``repeats`` draws, after one warm-up draw. Prints a markdown table; writes nothing.

Run from the repository root: ``.venv/bin/python -m benchmarks.noise_cost [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable

import torch
from dpsynth_ml.dp.noise import ChaChaGaussian

from benchmarks.common import RESULTS_DIR

CPU = torch.device("cpu")


def _median_times(draw: Callable[[], torch.Tensor], repeats: int) -> tuple[float, float]:
    """(median wall s, median process CPU s) of ``repeats`` calls after one warm-up."""
    draw()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        draw()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _step_times() -> dict[str, tuple[int, float]]:
    """Trainable parameters and DP step CPU time per mode of the committed dp_overhead run."""
    try:
        data = json.loads((RESULTS_DIR / "dp_overhead.json").read_text())
    except (OSError, ValueError):
        return {}
    return {mode: (int(m["trainable_parameters"]), float(m["cpu_s_dp"]))
            for mode, m in data["results"]["modes"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (dp_overhead's CPU scale uses 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sources = {backend: ChaChaGaussian(secrets.token_bytes(32), kind="os", keystream=backend)
               for backend in ("torch", "openssl")}
    generator = torch.Generator().manual_seed(0)
    steps = _step_times()
    rows: list[tuple[str, int, float | None]] = [
        (f"{n // 1_000_000}M values", n, None) for n in (1_000_000, 10_000_000)]
    rows += [(f"`small` {mode}", n, step) for mode, (n, step) in steps.items()]
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), "
          f"1-min load average {os.getloadavg()[0]:.1f} before")
    print("| draw | values | torch.normal CPU (ms) | ChaCha20, torch keystream CPU (ms) "
          "| ChaCha20, OpenSSL keystream CPU (ms) | OpenSSL wall (ms) | CPU ratio (OpenSSL) "
          "| added to the DP step (CPU, OpenSSL) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, n, step in rows:
        repeats = 3 if n >= 5_000_000 else 7
        _, normal = _median_times(lambda n=n: torch.normal(  # type: ignore[misc]
            0.0, 1.0, size=(n,), generator=generator), repeats)
        cpu: dict[str, float] = {}
        wall: dict[str, float] = {}
        for backend, source in sources.items():
            wall[backend], cpu[backend] = _median_times(
                lambda n=n, source=source: source.gaussian(  # type: ignore[misc]
                    (n,), 1.0, device=CPU, dtype=torch.float32), repeats)
        fast = cpu["openssl"]
        share = "" if step is None else f"+{(fast - normal) / step:.0%} of {step:.3f} s"
        print(f"| {label} | {n:,} | {normal * 1e3:.1f} | {cpu['torch'] * 1e3:.0f} "
              f"| {fast * 1e3:.0f} | {wall['openssl'] * 1e3:.0f} "
              f"| {fast / max(normal, 1e-9):.0f}x | {share} |")
    print(f"1-min load average {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
