"""How much a one-run audit can see (issue 19's design study): the lower bounds of the
(eps, delta) analysis (Steinke, Nasr and Jagielski; ``dpsynth_ml.audit.one_run``) and of the
f-DP analysis against the claim's GDP envelope (Mahloujifar et al.; ``dpsynth_ml.audit.gdp``
with the ledger's ``dp_sgd_gdp_envelope``) on white-box Dirac gradient canaries, for the
correct DP-SGD mechanism and for the broken ones issue 19 asks the audit to catch.

The observation model is the mechanism itself, not the training code: m canaries, each in
the run with probability 1/2; an included canary joins each of T steps with probability q
(Poisson sampling, as the engines' samplers) and adds its Dirac gradient, clipped to C, to
one coordinate of the summed gradient; each step releases that sum plus N(0, sigma^2 C^2)
per coordinate, and the auditor sees every step (white-box). sigma is the ledger's PLD
calibration for the claimed eps at (q, T, delta). A canary's score is the sum of its
coordinate over the steps (what ``dpsynth_ml.audit.whitebox`` computes). Guess counts are
each analysis' pre-registered candidates with their Bonferroni correction, at 95 %
confidence.

Broken mechanisms, each at the claimed eps's sigma and q:

* ``sigma/2``: half the accounted noise;
* ``2q``: twice the accounted sampling rate (only where q <= 1/2);
* ``no noise``: nothing added (sigma -> 0);
* ``no clipping``: canaries of norm 10 C pass unclipped.

A broken mechanism is caught by the (eps, delta) analysis when its bound exceeds the
claimed eps, by the f-DP analysis when its mu bound exceeds the claim's GDP envelope mu*
(reported as eps at delta; the envelope's own eps is in the ``claim`` column).

Run from the repository root (about 6 minutes on one core)::

    .venv/bin/python -m benchmarks.audit_power [--canaries 1000 10000 100000] [--repeats 3]
        [--shapes 1x1 0.1x50] [--claims 0.5 1 2] [--variants correct sigma/2 2q]
        [--seed 0] [--out benchmarks/results/audit_power.json]

(``--variants`` leaves the other mechanisms' cells empty, ``—``.)

The engine-level test's size (``tests/unit/ml/test_whitebox_audit.py``, the f-DP teeth)
comes from ``--canaries 200000 --repeats 5 --shapes 0.25x20 --out
benchmarks/results/audit_power_test_size.json``.

Whether the hooks engine (dense per-unit canary rows, cost ~ sampled canaries x trainable
values per step) can get the same teeth at a CPU test's size: ``--canaries 20000 40000
--repeats 5 --seed 1 --shapes 0.5x1 0.5x2 0.5x4 --variants correct sigma/2 2q --out
benchmarks/results/audit_power_hooks.json`` and, for the size it would need,
``--canaries 100000 --repeats 5 --seed 1 --shapes 0.5x4 0.5x8 --variants correct sigma/2
2q --out benchmarks/results/audit_power_hooks_100k.json``: it cannot (2q is missed at 40,000
canaries and caught without a margin at 100,000; docs/privacy.md).

Prints a markdown table (the median bounds over the repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier
from dpsynth_ml.audit.gdp import audit_gdp
from dpsynth_ml.audit.one_run import audit
from dpsynth_shared.gdp import gdp_epsilon

DELTA = 1e-5
CLAIMS = (0.5, 1.0, 2.0)
SHAPES = ((1.0, 1), (0.1, 50))  # (q, T): one full-batch step; a subsampled run
VARIANTS = ("correct", "sigma/2", "2q", "no noise", "no clipping")


def scores(m: int, steps: int, q: float, sigma: float, *, variant: str,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scores, coin flips) of one white-box run of ``variant`` (C = 1)."""
    included = rng.random(m) < 0.5
    true_sigma = {"sigma/2": sigma / 2, "no noise": 1e-9}.get(variant, sigma)
    true_q = min(1.0, 2 * q) if variant == "2q" else q
    canary = 10.0 if variant == "no clipping" else 1.0
    total = np.zeros(m)
    for _ in range(steps):
        present = (rng.random(m) < true_q) & included
        total += canary * present + true_sigma * rng.standard_normal(m)
    return total, included


def run(canaries: list[int], repeats: int, seed: int,
        shapes: tuple[tuple[float, int], ...] = SHAPES,
        claims: tuple[float, ...] = CLAIMS,
        variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for eps in claims:
        for q, steps in shapes:
            sigma = calibrate_noise_multiplier(eps, q, steps, DELTA)
            envelope = dp_sgd_gdp_envelope(sigma, q, steps)
            for m in canaries:
                row: dict[str, Any] = {
                    "claimed_epsilon": eps, "sample_rate": q, "steps": steps,
                    "noise_multiplier": sigma, "canaries": m, "claimed_mu": envelope.mu,
                    "claimed_mu_epsilon": gdp_epsilon(envelope.mu, DELTA),
                    "tail_delta": envelope.tail_delta}
                one_run = None
                for variant in VARIANTS:
                    if variant not in variants:
                        row[variant] = None  # not asked for (--variants)
                        continue
                    if variant == "2q" and q > 0.5:
                        row[variant] = None  # 2q would not be a rate: not a mechanism
                        continue
                    cells = []
                    for _ in range(repeats):
                        s, included = scores(m, steps, q, sigma, variant=variant, rng=rng)
                        one_run = audit(s, included, confidence=0.95, delta=DELTA)
                        gdp = audit_gdp(s, included, confidence=0.95, delta=DELTA,
                                        claimed_mu=envelope.mu,
                                        tail_delta=envelope.tail_delta)
                        cells.append({"epsilon_delta": one_run.epsilon_lower_bound,
                                      "gdp_mu": gdp.mu_lower_bound,
                                      "gdp_epsilon": gdp.epsilon_lower_bound,
                                      "gdp_rejects_claim": gdp.rejected})
                    row[variant] = cells
                row["max_certifiable"] = one_run.max_certifiable if one_run else None
                rows.append(row)
                print(_line(row), flush=True)
    return {"delta": DELTA, "confidence": 0.95, "repeats": repeats, "seed": seed,
            "variants": list(variants), "rows": rows}


def _cell(cells: list[dict[str, Any]] | None, eps: float, broken: bool) -> str:
    if cells is None:
        return "—"
    one = statistics.median(c["epsilon_delta"] for c in cells)
    gdp = statistics.median(c["gdp_epsilon"] for c in cells)
    caught_one = all(c["epsilon_delta"] > eps for c in cells)
    caught_gdp = all(c["gdp_rejects_claim"] for c in cells)
    if broken:
        marks = ("✓" if caught_one else "✗", "✓" if caught_gdp else "✗")
    else:  # the correct mechanism: a mark only where a claim was (wrongly) rejected
        marks = ("" if not any(c["epsilon_delta"] > eps for c in cells) else "⚠",
                 "" if not any(c["gdp_rejects_claim"] for c in cells) else "⚠")
    return f"{one:.2f}{marks[0]} / {gdp:.2f}{marks[1]}"


def _line(row: dict[str, Any]) -> str:
    eps = row["claimed_epsilon"]
    cells = [_cell(row[v], eps, v != "correct") for v in VARIANTS]
    return (f"| {eps} ({row['claimed_mu_epsilon']:.2f}) | {row['sample_rate']} × "
            f"{row['steps']} (σ {row['noise_multiplier']:.2f}) | {row['canaries']:,} | "
            + " | ".join(cells) + " | " + ("—" if row["max_certifiable"] is None
                                     else f"{row['max_certifiable']:.2f}") + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--canaries", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--shapes", nargs="+", default=[f"{q:g}x{t}" for q, t in SHAPES],
                        help="sampling rate x steps, e.g. 0.25x20")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--claims", type=float, nargs="+", default=list(CLAIMS),
                        help="claimed epsilons")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="mechanisms to simulate (the others' cells are —)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print("| claimed ε (GDP envelope's ε) | q × T | canaries | "
          + " | ".join(VARIANTS) + " | max certifiable (ε, δ) |")
    print("|---" * (4 + len(VARIANTS)) + "|")
    start = time.perf_counter()
    shapes = tuple((float(a), int(b)) for a, b in (s.split("x") for s in args.shapes))
    results = run(args.canaries, args.repeats, args.seed, shapes, tuple(args.claims),
                  tuple(args.variants))
    results["wall_s"] = round(time.perf_counter() - start, 1)
    print(f"\n{results['wall_s']} s; each cell: the (eps, delta) bound / the f-DP bound as "
          "eps; ✓ caught in every repeat, ✗ not, ⚠ the correct mechanism's claim rejected")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
