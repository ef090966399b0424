"""``make bench``: every benchmark at ``BENCH_SCALE`` (default ``cpu``), then the docs.

Each benchmark runs as its own process (``python -m benchmarks.NAME``: a crash or a leaked
thread pool of one cannot skew the next), writes ``benchmarks/results/NAME.json`` and has its
wall time printed. A failing benchmark is reported and the others still run; the exit status
is 1 if any failed. Then ``render_docs`` regenerates the tables of ``docs/benchmarks.md``
from whatever results exist (a failed benchmark keeps its previous results, with their own
date and command).

Usage::

    .venv/bin/python -m benchmarks.run_all                  # all, at BENCH_SCALE
    .venv/bin/python -m benchmarks.run_all service_load     # only the ones named
    BENCH_SCALE=full .venv/bin/python -m benchmarks.run_all # paper-sized, on a GPU

``BENCH_ONLY=a,b`` does the same as naming them (``make bench BENCH_ONLY=service_load``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks import render_docs
from benchmarks.common import ROOT, SCALE

BENCHMARKS = ["dp_overhead", "sampling_speed", "service_load", "fmnist_table"]
"""In the order they run: the short ones first, so a failure shows early. ``fmnist_table``
(the 28x28 Fashion-MNIST table, three blocks) takes about an hour at CPU scale on its own:
``make bench`` is over its 30-minute budget (docs/benchmarks.md says by how much)."""

BY_NAME_ONLY = ["fmnist_no_public", "fmnist_no_public_check", "fmnist_privacy_utility",
                "fmnist_table_long"]
"""Run only when named (``make bench BENCH_ONLY=fmnist_no_public``): the no-public block on
its own (with the GPU scales), its reduced re-check, the earlier 16x16 latent benchmark
(2,000 private images; superseded by ``fmnist_table``) and ``make bench-long``'s 3-seed
table."""

CPU_BUDGET_S = 30 * 60
"""``make bench`` at CPU scale must stay under 30 minutes on 2 cores (issue 5)."""


def run_one(name: str) -> tuple[str, float]:
    """Run one benchmark module; returns its outcome (``ok``, ``failed (rc N)``, ``missing``)
    and its wall time."""
    if not (ROOT / "benchmarks" / f"{name}.py").exists():
        return "missing", 0.0
    print(f"\n=== {name} (BENCH_SCALE={SCALE}) ===", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], cwd=ROOT,
                          env={**os.environ, "BENCH_SCALE": SCALE}, check=False)
    wall = time.perf_counter() - t0
    outcome = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    print(f"=== {name}: {outcome} in {wall:.0f} s ===", flush=True)
    return outcome, wall


def main(argv: list[str]) -> int:
    wanted = argv or [n for n in os.environ.get("BENCH_ONLY", "").split(",") if n]
    unknown = [n for n in wanted if n not in BENCHMARKS + BY_NAME_ONLY]
    if unknown:
        print(f"unknown benchmarks: {unknown}; known: {BENCHMARKS + BY_NAME_ONLY}",
              file=sys.stderr)
        return 2
    names = wanted or BENCHMARKS
    t0 = time.perf_counter()
    outcomes = {name: run_one(name) for name in names}
    total = time.perf_counter() - t0
    print("\nBenchmark                 outcome            wall (s)")
    for name, (outcome, wall) in outcomes.items():
        print(f"{name:<25} {outcome:<18} {wall:8.0f}")
    print(f"{'total':<25} {'':<18} {total:8.0f}")
    if SCALE == "cpu" and not wanted and total > CPU_BUDGET_S:
        print(f"WARNING: the CPU run took {total / 60:.1f} min, over the "
              f"{CPU_BUDGET_S // 60}-minute budget", flush=True)
    rc_docs = render_docs.main()
    failed = [n for n, (outcome, _) in outcomes.items() if outcome != "ok"]
    if failed:
        print(f"make bench: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return rc_docs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
