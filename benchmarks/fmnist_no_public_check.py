"""A reduced re-check of ``benchmarks.fmnist_no_public`` after the pixel-sampler fix.

The settings the designer-slice check chose after the fix (docs: benchmarks/notes/
fmnist_no_public.md, "Where it stands"): 1,500 central-image warm-up steps and DDIM with 50
steps; one seed and 1,000-image corpora; the ε 10 and ε 1 generator rows (release + warm-up
+ DP-SGD, each ε the ledger's PLD total) and the ε ∞ row. Everything else is the ``cpu``
scale of ``fmnist_no_public``. About 13 minutes on 2 cores.

Run: ``.venv/bin/python -m benchmarks.fmnist_no_public_check`` (writes
``benchmarks/results/fmnist_no_public_check.json``).
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import bench_main

NAME = "fmnist_no_public_check"
OVERRIDES: dict[str, Any] = {"warmup_steps": 1500, "sampler": "ddim", "sampler_steps": 50,
                             "headline_seeds": 1, "headline_per_class": 100,
                             "other_per_class": 100}
ROWS = frozenset({"eps_10", "eps_1", "eps_inf"})


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
