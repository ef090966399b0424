"""How much a one-run audit can see (issue 19's design study): the Steinke-Nasr-Jagielski
lower bound (``dpsynth_ml.audit.one_run``) on white-box Dirac gradient canaries, for the
correct DP-SGD mechanism and for the broken ones issue 19 asks the audit to catch.

The observation model is the mechanism itself, not the training code: m canaries, each in
the run with probability 1/2; an included canary joins each of T steps with probability q
(Poisson sampling, as the engines' samplers) and adds its Dirac gradient, clipped to C, to
one coordinate of the summed gradient; each step releases that sum plus N(0, sigma^2 C^2)
per coordinate, and the auditor sees every step (white-box). sigma is the ledger's PLD
calibration for the claimed eps at (q, T, delta). The canary's score is either the sum of
its coordinate over the steps, or the per-step log-likelihood ratio of the subsampled
Gaussian (``log(1 - q + q exp((x - C/2) / (sigma^2 C)))``, summed; the most powerful test
of one canary's presence). The guess counts are the pre-registered candidates with their
Bonferroni correction (``default_guess_counts``), at 95 % confidence.

Broken mechanisms, each at the claimed eps's sigma and q:

* ``sigma/2``: half the accounted noise;
* ``2q``: twice the accounted sampling rate (only where q <= 1/2);
* ``no noise``: nothing added (sigma -> 0);
* ``no clipping``: canaries of norm 10 C pass unclipped.

Run from the repository root (about 5 minutes on one core)::

    .venv/bin/python -m benchmarks.audit_power [--canaries 1000 10000] [--repeats 3]
        [--out benchmarks/results/audit_power.json]

Prints a markdown table (the median bound over the repeats, and the range).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier
from dpsynth_ml.audit.one_run import audit

DELTA = 1e-5
CLAIMS = (0.5, 1.0, 2.0)
SHAPES = ((1.0, 1), (0.1, 50))  # (q, T): one full-batch step; a subsampled run
VARIANTS = ("correct", "sigma/2", "2q", "no noise", "no clipping")


def scores(m: int, steps: int, q: float, sigma: float, *, variant: str, statistic: str,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scores, coin flips) of one white-box run of ``variant`` (C = 1)."""
    included = rng.random(m) < 0.5
    true_sigma = {"sigma/2": sigma / 2, "no noise": 1e-9}.get(variant, sigma)
    true_q = min(1.0, 2 * q) if variant == "2q" else q
    canary = 10.0 if variant == "no clipping" else 1.0
    log_keep = math.log1p(-q) if q < 1 else -math.inf
    total = np.zeros(m)
    for _ in range(steps):
        present = (rng.random(m) < true_q) & included
        observed = canary * present + true_sigma * rng.standard_normal(m)
        if statistic == "sum":
            total += observed
        else:  # the auditor's test is the claimed mechanism's likelihood ratio
            total += np.logaddexp(log_keep, math.log(q) + (observed - 0.5) / sigma ** 2)
    return total, included


def run(canaries: list[int], repeats: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for eps in CLAIMS:
        for q, steps in SHAPES:
            sigma = calibrate_noise_multiplier(eps, q, steps, DELTA)
            for m in canaries:
                for statistic in ("sum", "llr"):
                    row: dict[str, Any] = {"claimed_epsilon": eps, "sample_rate": q,
                                           "steps": steps, "noise_multiplier": sigma,
                                           "canaries": m, "statistic": statistic}
                    for variant in VARIANTS:
                        if variant == "2q" and q > 0.5:
                            row[variant] = None  # 2q would not be a rate: not a mechanism
                            continue
                        bounds = []
                        for _ in range(repeats):
                            s, included = scores(m, steps, q, sigma, variant=variant,
                                                 statistic=statistic, rng=rng)
                            result = audit(s, included, confidence=0.95, delta=DELTA)
                            bounds.append(result.epsilon_lower_bound)
                        row[variant] = bounds
                    row["max_certifiable"] = result.max_certifiable
                    rows.append(row)
                    print(_line(row), flush=True)
    return {"delta": DELTA, "confidence": 0.95, "repeats": repeats, "seed": seed,
            "rows": rows}


def _cell(bounds: list[float] | None, eps: float, broken: bool) -> str:
    if bounds is None:
        return "—"
    median = statistics.median(bounds)
    caught = all(b > eps for b in bounds) if broken else all(b <= eps for b in bounds)
    mark = "" if caught else (" ✗" if broken else " ⚠")
    return f"{median:.2f} ({min(bounds):.2f}–{max(bounds):.2f}){mark}"


def _line(row: dict[str, Any]) -> str:
    eps = row["claimed_epsilon"]
    cells = [_cell(row[v], eps, v != "correct") for v in VARIANTS]
    return (f"| {eps} | {row['sample_rate']} × {row['steps']} (σ {row['noise_multiplier']:.2f})"
            f" | {row['canaries']:,} | {row['statistic']} | " + " | ".join(cells)
            + f" | {row['max_certifiable']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--canaries", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print("| claimed ε | q × T | canaries | score | " + " | ".join(VARIANTS)
          + " | max certifiable |")
    print("|---" * (5 + len(VARIANTS)) + "|")
    start = time.perf_counter()
    results = run(args.canaries, args.repeats, args.seed)
    results["wall_s"] = round(time.perf_counter() - start, 1)
    print(f"\n{results['wall_s']} s; ✗ = a broken mechanism not caught in every repeat, "
          "⚠ = the correct one's bound above its claim")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
