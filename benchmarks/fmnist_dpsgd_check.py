"""Designer check (issue 18, the "DP-SGD adds at least 4 points" aim): what do the DP-SGD
steps add to ONE warm-up, from ONE release?

The table's comparison (``eps_10`` against ``warmup_only_10``) mixes two things: the DP-SGD
steps, and the release they take half of ε from. This check holds the release and the warm-up
fixed (the ``cpu`` recipe's release at the ε 10 split, ``release_fraction`` of ε) and varies
only what follows: nothing, or DP-SGD variants whose σ is calibrated so that the release and
the steps compose to ε 10 (the ledger's PLD, :func:`benchmarks.fmnist_no_public.
split_epsilon`). Accuracy of the CNN trained on each model's corpus, on the DESIGNER slice
(training images disjoint from the private and test sets; the test set is never read).

Usage::

    PYTHONPATH=shared/src:services/worker/src:services/ledger/src:. \\
        .venv/bin/python -m benchmarks.fmnist_dpsgd_check --warmup-steps 1500 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "none": {"dp_steps": 0},
    "recipe": {"dp_steps": 6},  # the cpu recipe: B 1,000 (q 0.1), lr 1e-4, clip 1e-3
    "tiny_lr": {"dp_steps": 6, "dp_learning_rate": 1e-5},
    "long_big_batch": {"dp_steps": 20, "dp_batch_size": 2500},
}


def _dp_from(cfg: dict[str, Any], warm: Path, dataset: Path, out: Path, *,
             sigma: float) -> Path:
    """DP-SGD only (no release: the warm model already holds it) from ``warm``."""
    from dpsynth_ml.parallel.placement import train_on_device
    from dpsynth_ml.spec import DpSpec, FinetuneTraining, RecordLevel

    from benchmarks import fmnist_no_public as bench

    q = cfg["dp_batch_size"] / cfg["private_size"]
    dp = DpSpec(noise_multiplier=sigma, sample_rate=q, expected_batch_size=cfg["dp_batch_size"],
                max_grad_norm=cfg["max_grad_norm"], steps=cfg["dp_steps"])
    spec = FinetuneTraining(image_size=28, channels=1, trainable="full",
                            privacy=RecordLevel(dp), noise_multiplicity=cfg["noise_multiplicity"],
                            ema_decay=cfg["ema_decay"], learning_rate=cfg["dp_learning_rate"],
                            max_physical_batch_size=cfg["max_physical_batch_size"],
                            checkpoint_every=cfg["dp_steps"])
    return train_on_device(bench._device(), spec, dataset_path=dataset, out_dir=out,
                           base_model_dir=warm).model_dir


def main() -> int:
    import torch

    from benchmarks import fmnist_no_public as bench
    from benchmarks.fmnist_designer_check import _slice
    from benchmarks.fmnist_privacy_utility import CLASS_NAMES, save_npz

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--smoke", action="store_true", help="a few steps of everything "
                        "(checks the pipeline; its accuracies mean nothing)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = dict(bench.SIZES["cpu"])
    if args.warmup_steps:
        cfg["warmup_steps"] = args.warmup_steps
    if args.smoke:
        cfg.update(warmup_steps=3, sampler_steps=2)
    results: dict[str, Any] = {"settings": {k: cfg[k] for k in (
        "warmup_steps", "release_fraction", "dp_batch_size", "dp_steps", "dp_learning_rate",
        "max_grad_norm", "private_size")}, "per_class": args.per_class, "rows": {}}
    slice_ = _slice(cfg)
    with tempfile.TemporaryDirectory(prefix="dpsgd-check-") as tmp:
        work = Path(tmp)
        data = bench._data(cfg)
        save_npz(work / "private.npz", data["private"][0], data["private"][1], CLASS_NAMES)
        base = bench._base_model(cfg, work / "base", args.seed)
        split = bench.split_epsilon(10.0, cfg, dp_steps=cfg["dp_steps"])
        noise_std = split["release"]["noise_std"]
        results["release"] = split["release"]
        t0 = time.perf_counter()
        warm, _ = bench._finetune(cfg, base, work / "private.npz", work / "warm",
                                  noise_std=noise_std, sigma=1.0, steps=0)
        results["warmup_s"] = round(time.perf_counter() - t0, 1)
        print(f"warm-up {results['warmup_s']} s", flush=True)
        for name in args.variants.split(","):
            change = VARIANTS[name]
            vcfg = {**cfg, **change}
            if args.smoke and vcfg["dp_steps"]:
                vcfg.update(dp_steps=1, dp_batch_size=50)
            t0 = time.perf_counter()
            row: dict[str, Any] = {"change": change}
            model = warm
            if vcfg["dp_steps"]:
                vsplit = bench.split_epsilon(10.0, vcfg, dp_steps=vcfg["dp_steps"])
                assert vsplit["release"]["noise_std"] == noise_std  # the same release
                row["dp_sgd"] = vsplit["dp_sgd"]
                row["composed_epsilon"] = vsplit["composed_epsilon"]
                model = _dp_from(vcfg, warm, work / "private.npz", work / name,
                                 sigma=vsplit["dp_sgd"]["event"]["noise_multiplier"])
            row["train_s"] = round(time.perf_counter() - t0, 1)
            row.update(bench._corpus_accuracy(vcfg, model, work / f"corpus-{name}",
                                              args.per_class, args.seed, slice_))
            results["rows"][name] = row
            print(name, json.dumps({k: row[k] for k in ("accuracy", "train_s", "corpus")}),
                  flush=True)
            args.out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
