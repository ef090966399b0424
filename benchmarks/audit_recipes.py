"""White-box and black-box audits of the finetune recipes in ``examples/`` at CPU scale
(issue 19): the claimed epsilon beside the measured lower bounds, for docs/privacy.md.

Each recipe's training settings (trainable set, clipping norm, noise multiplicity, EMA, LR
warm-up, label dropout, micro-batches) are kept; its size is cut to the CPU: a public
stand-in of scikit-learn's 1,797 digits (16x16) with a declared size N̂ = 2,000, an expected
batch of min(recipe's, 128), at most 30 steps, micro-batches of at most 64. The noise
multiplier is the ledger's PLD calibration of the recipe's target epsilon at that (q,
steps) and delta 1e-5, the claim's GDP envelope the ledger's ``dp_sgd_gdp_envelope``. The
base model is the ``small`` preset pretrained for one epoch on the stand-in (its weights do
not enter the mechanism). ``dpsynth_ml.audit_finetune`` then runs each finetune's own steps
with gradient canaries (20,000 where the trainable set has that many values, else every
value) and returns the (eps, delta) bound (Steinke et al.) and the f-DP bound against the
envelope (Mahloujifar et al.), at 95 %. ``dpsynth_ml.black_box_audit_finetune`` runs the
same finetune again with noise-image loss canaries among the stand-in's records (N̂/2 of
them, the most the audited N̂ holds) and scores each on the finished model: the same two
bounds, as a holder of the released model could measure them.

The per-label recipe is audited on one class's run (a per-label finetune is one DP-SGD run
per class, each on its class's declared size; the stand-in's classes are declared 200
records each, so every class has the same sigma and any class is the largest-epsilon one).

The recipes the audit does not cover yet are listed with the reason (central images,
layout generator, DP-Promise).

Run from the repository root (about 20-30 minutes on 2 cores)::

    .venv/bin/python -m benchmarks.audit_recipes [--out benchmarks/results/audit_recipes.json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ledger.accounting.pld import calibrate_noise_multiplier
from dpsynth_ml import (
    DpSpec,
    FinetuneTraining,
    PerLabel,
    PretrainTraining,
    RecordLevel,
    audit_finetune,
    black_box_audit_finetune,
    train,
)
from dpsynth_shared.gdp import gdp_epsilon
from dpsynth_shared.job_specs import FinetuneSpec

from benchmarks.common import ROOT, machine_info

DELTA = 1e-5
DECLARED_SIZE = 2000
MAX_BATCH, MAX_STEPS, MAX_MICRO = 128, 30, 64
CLASS_SIZE = 200
"""The declared size of each stand-in class in the per-label recipe's runs."""
AUDITED_CLASS = "0"
CANARIES = 20_000
RECIPES = ["examples/quickstart/finetune.yaml", "examples/finetune.yaml",
           "examples/finetune-dp-ldms-attention.yaml", "examples/finetune-dp-lora.yaml",
           "examples/finetune-dpdm-noise-multiplicity.yaml",
           "examples/finetune-dp-docldm-per-label.yaml"]
NOT_COVERED = {
    "examples/finetune-central-images.yaml": "its central-image release is a separate "
    "Gaussian mechanism, not audited yet (its DP-SGD part is the same code as the rows)",
    "examples/finetune-dp-layout-generator.yaml": "its records are layout masks; the "
    "stand-in would need masks (not built yet)",
    "examples/finetune-dp-promise.yaml": "DP-Promise is refused by the api (docs/privacy.md)",
}


def _stand_in(folder: Path) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    path = folder / "digits.npz"
    np.savez(path, images=images, labels=digits.target.astype(np.int64),
             class_names=np.array([str(i) for i in range(10)]))
    return path


def _training(recipe: FinetuneSpec, dp: DpSpec) -> FinetuneTraining:
    t = recipe.training
    privacy: RecordLevel | PerLabel = RecordLevel(dp)
    if t.per_label:
        privacy = PerLabel({str(c): RecordLevel(dp) for c in range(10)})
    return FinetuneTraining(
        image_size=16, channels=1, class_conditional=t.class_conditional, num_classes=10,
        trainable=t.trainable, blocks=tuple(t.blocks) if t.blocks else None,
        lora_rank=t.lora_rank, lora_alpha=t.lora_alpha, train_embedder=t.train_embedder,
        noise_multiplicity=t.noise_multiplicity, ema_decay=t.ema_decay,
        warmup_steps=min(t.warmup_steps, dp.steps), learning_rate=t.learning_rate,
        label_dropout=t.label_dropout, timestep_distribution=t.timestep_distribution,
        max_physical_batch_size=min(t.max_physical_batch_size, MAX_MICRO),
        checkpoint_every=t.checkpoint_every, privacy=privacy)


def audit_recipe(path: str, *, data: Path, base: Path) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / path).read_text())
    raw.update(dataset_id="ds_standin", base_model_id="mdl_standin")
    raw["training"].pop("class_map", None)  # the stand-in's classes are the base model's
    recipe = FinetuneSpec.model_validate(raw)
    t, eps = recipe.training, recipe.privacy.target_epsilon
    population = CLASS_SIZE if t.per_label else DECLARED_SIZE
    batch = min(t.expected_batch_size, MAX_BATCH, population)
    q = batch / population
    steps = min(MAX_STEPS, math.ceil(t.epochs * population / batch))
    sigma = calibrate_noise_multiplier(eps, q, steps, DELTA)
    envelope = dp_sgd_gdp_envelope(sigma, q, steps)
    dp = DpSpec(noise_multiplier=sigma, sample_rate=q, expected_batch_size=batch,
                max_grad_norm=recipe.privacy.max_grad_norm, steps=steps, epsilon=eps,
                delta=DELTA)
    spec = _training(recipe, dp)
    audited_class = AUDITED_CLASS if t.per_label else None
    claim = {"claimed_mu": envelope.mu, "tail_delta": envelope.tail_delta,
             "audited_class": audited_class, "delta": DELTA}
    start = time.perf_counter()
    white = None
    for canaries in (CANARIES, 5000, 1000):
        try:
            white = audit_finetune(spec, dataset_path=data, base_model_dir=base,
                                   canaries=canaries, generator=torch.Generator().manual_seed(0),
                                   **claim)
            break
        except ValueError as err:  # fewer trainable values than canaries
            if "coordinates" not in str(err):
                raise
    assert white is not None
    white_s = time.perf_counter() - start
    start = time.perf_counter()
    black = black_box_audit_finetune(spec, dataset_path=data, base_model_dir=base,
                                     canaries=population // 2,
                                     generator=torch.Generator().manual_seed(1), **claim)
    black_s = time.perf_counter() - start
    return {
        "recipe": path, "trainable": t.trainable, "noise_multiplicity": t.noise_multiplicity,
        "ema_decay": t.ema_decay, "max_grad_norm": recipe.privacy.max_grad_norm,
        "per_label": t.per_label, "audited_class": audited_class, "declared_size": population,
        "claimed_epsilon": eps, "sample_rate": q, "expected_batch_size": batch,
        "steps": steps, "noise_multiplier": sigma, "envelope_mu": envelope.mu,
        "envelope_epsilon": gdp_epsilon(envelope.mu, DELTA),
        "canaries": white.bound.canaries, "confidence": white.bound.confidence,
        **_bounds(white.bound, white.gdp),
        "seconds": round(white_s, 1),
        "black_box": {"canaries": black.bound.canaries, "included": black.included,
                      "stand_in_records": black.stand_in_records,
                      **_bounds(black.bound, black.gdp), "seconds": round(black_s, 1)}}


def _bounds(bound: Any, gdp: Any) -> dict[str, Any]:
    return {"epsilon_delta_bound": bound.epsilon_lower_bound,
            "max_certifiable": bound.max_certifiable,
            "gdp_mu_bound": gdp.mu_lower_bound, "gdp_epsilon_bound": gdp.epsilon_lower_bound,
            "gdp_max_certifiable_mu": gdp.max_certifiable_mu,
            "gdp_max_certifiable_epsilon": gdp_epsilon(gdp.max_certifiable_mu, DELTA),
            "claim_rejected": gdp.rejected}


def table(results: dict[str, Any]) -> str:
    """docs/privacy.md's table of a results file: claimed epsilon beside both audits."""
    def cell(r: dict[str, Any]) -> str:
        return (f"{r['epsilon_delta_bound']:.2f} ({r['max_certifiable']:.2f}) / "
                f"{r['gdp_epsilon_bound']:.2f} ({r['gdp_max_certifiable_epsilon']:.2f})")

    lines = ["| recipe | trainable, K, EMA, C | claimed ε | run at CPU scale (N̂, q × steps, "
             "σ) | claim's GDP envelope as ε | white-box: canaries; (ε, δ) / f-DP bound "
             "(ceiling) | black-box: canaries; (ε, δ) / f-DP bound (ceiling) | claim "
             "rejected | seconds (white, black) |", "|---" * 9 + "|"]
    for r in results["rows"]:
        b = r["black_box"]
        name = r["recipe"].removeprefix("examples/")
        if r.get("per_label"):
            name += f" (class {r['audited_class']})"
        ema = "—" if r["ema_decay"] is None else r["ema_decay"]
        rejected = "yes" if r["claim_rejected"] or b["claim_rejected"] else "no"
        lines.append(
            f"| `{name}` | {r['trainable']}, K {r['noise_multiplicity']}, EMA {ema}, "
            f"C {r['max_grad_norm']} | {r['claimed_epsilon']:g} | "
            f"{r.get('declared_size', results['declared_size']):,}, {r['sample_rate']:.3g} × "
            f"{r['steps']} (σ {r['noise_multiplier']:.3f}) | {r['envelope_epsilon']:.2f} | "
            f"{r['canaries']:,}; {cell(r)} | {b['canaries']:,}; {cell(b)} | {rejected} | "
            f"{r['seconds']:.0f}, {b['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, metavar="RESULTS",
                        help="print docs/privacy.md's table of a results file and exit")
    parser.add_argument("--recipes", nargs="*", default=RECIPES, choices=RECIPES,
                        help="a subset of the recipes (default: all)")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(2)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dpsynth-audit-recipes-") as work:
        folder = Path(work)
        data = _stand_in(folder)
        base = train(PretrainTraining(preset="small", image_size=16, epochs=1, batch_size=64,
                                      seed=0), dataset_path=data, out_dir=folder / "base")
        for path in args.recipes:
            row = audit_recipe(path, data=data, base=base.model_dir)
            rows.append(row)
            print(json.dumps(row), flush=True)
    results = {"delta": DELTA, "declared_size": DECLARED_SIZE, "rows": rows,
               "not_covered": NOT_COVERED, "machine": machine_info(),
               "wall_s": round(time.perf_counter() - started, 1)}
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
