"""A reduced run of ``benchmarks.fmnist_no_public``: the ``cpu`` scale at one seed.

The ``cpu`` scale's settings (chosen on the designer slice: second moments, a three-level
UNet, a 1,500-step warm-up ending on its EMA, DPM-Solver++ with 20 steps; docs:
benchmarks/notes/fmnist_no_public.md), ONE seed and 1,000-image corpora, the generator rows
only: ε 10 and ε 1 (release + warm-up + DP-SGD, each ε the ledger's PLD total), the warm-up
alone at ε 10 and ε 1 (the whole ε on the release), and ε ∞. About 15 minutes on 2 idle
cores.

Run: ``.venv/bin/python -m benchmarks.fmnist_no_public_check`` (writes
``benchmarks/results/fmnist_no_public_check.json``).
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import bench_main

NAME = "fmnist_no_public_check"
OVERRIDES: dict[str, Any] = {"headline_seeds": 1, "headline_per_class": 100,
                             "other_per_class": 100}
ROWS = frozenset({"eps_10", "eps_1", "warmup_only_10", "warmup_only_1", "eps_inf"})


def table_markdown(results: dict[str, Any]) -> str:
    """The table of docs/benchmarks.md: ``fmnist_no_public``'s, with the rows not run here
    marked "not measured"."""
    from benchmarks import fmnist_no_public

    return fmnist_no_public.table_markdown(results)


def run(scale: str) -> dict[str, Any]:
    """The reduced run at ``scale`` (``cpu``) with :data:`OVERRIDES`, the rows of :data:`ROWS`."""
    from benchmarks import fmnist_no_public

    if scale != "cpu":
        raise SystemExit(f"{NAME} is a CPU re-check; run fmnist_no_public at {scale!r}")
    cfg = {**fmnist_no_public.SIZES["cpu"], **OVERRIDES}
    out = fmnist_no_public.run("cpu", cfg=cfg, select=lambda job: job["row"] in ROWS)
    return {**out, "overrides": OVERRIDES}


if __name__ == "__main__":
    bench_main(NAME, run)
