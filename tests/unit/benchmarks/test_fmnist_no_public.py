"""benchmarks/fmnist_no_public.py: its ε split against the ledger's accounting, the
invariants of its settings table, and a micro-run of the whole pipeline on a few hundred
images (skipped without Debian's dataset-fashion-mnist)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dpsynth_ledger.accounting import (
    calibrate_gaussian_sigma,
    calibrate_noise_multiplier,
    dp_sgd_epsilon,
    gaussian_epsilon,
    pld_epsilon,
)
from dpsynth_shared.central_images import central_image_bound, central_image_unit_norm
from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent

from benchmarks import fmnist_no_public as bench
from benchmarks.fmnist_privacy_utility import FMNIST_DIR

CPU = bench.SIZES["cpu"]


@pytest.mark.parametrize("eps", [1.0])
def test_the_split_composes_to_at_most_the_total_with_the_smallest_sigma(eps: float) -> None:
    split = bench.split_epsilon(eps, CPU, dp_steps=CPU["dp_steps"])
    bound = central_image_bound(28, 1, CPU["downsample"])
    rel = GaussianEvent(**split["release"]["event"])
    dp = DpSgdEvent(**split["dp_sgd"]["event"])
    # the release: the ledger's Gaussian calibration at the release's share of ε; with the
    # second moments the unit norm is √2 times the bound 7
    assert CPU["second_moments"] and bound == 7.0
    assert rel.sensitivity == pytest.approx(central_image_unit_norm(bound, True))
    assert rel.sensitivity == pytest.approx(7.0 * math.sqrt(2.0))
    want = calibrate_gaussian_sigma(CPU["release_fraction"] * eps, bench.DELTA)
    assert rel.sigma / rel.sensitivity == pytest.approx(want, rel=1e-12)
    assert split["release"]["noise_std"] == pytest.approx(rel.sigma)
    assert split["release"]["epsilon"] <= CPU["release_fraction"] * eps * (1 + 1e-9)
    assert split["release"]["epsilon"] == pytest.approx(
        gaussian_epsilon(rel.sigma / rel.sensitivity, bench.DELTA), rel=1e-2)
    # DP-SGD: q = B / N, the configured steps, its standalone ε by the ledger
    assert dp.sample_rate == pytest.approx(CPU["dp_batch_size"] / CPU["private_size"])
    assert dp.steps == CPU["dp_steps"]
    assert split["dp_sgd"]["epsilon"] == pytest.approx(
        dp_sgd_epsilon(dp.noise_multiplier, dp.sample_rate, dp.steps, bench.DELTA))
    # the composition, recomputed by the ledger, is within the total and tight
    composed = pld_epsilon([rel, dp], bench.DELTA)
    assert composed == pytest.approx(split["composed_epsilon"])
    assert composed <= eps * (1 + 1e-9)
    lower = dp.model_copy(update={"noise_multiplier": dp.noise_multiplier / 1.003})
    assert pld_epsilon([rel, lower], bench.DELTA) > eps
    # composing costs more than DP-SGD alone at the whole ε
    alone = calibrate_noise_multiplier(eps, dp.sample_rate, dp.steps, bench.DELTA)
    assert dp.noise_multiplier > alone


def test_warmup_only_spends_the_whole_epsilon_on_the_release() -> None:
    split = bench.split_epsilon(1.0, CPU, dp_steps=0)
    assert split["dp_sgd"] is None and split["release_fraction"] == 1.0
    rel = GaussianEvent(**split["release"]["event"])
    assert rel.sigma / rel.sensitivity == pytest.approx(
        calibrate_gaussian_sigma(1.0, bench.DELTA), rel=1e-12)
    assert split["composed_epsilon"] <= 1.0 * (1 + 1e-9)
    assert split["composed_epsilon"] == pytest.approx(1.0, rel=2e-3)


def test_dp_feta_subsampled_queries_are_a_dp_sgd_event() -> None:
    cfg = bench.SIZES["gpu"]
    split = bench.split_epsilon(10.0, cfg, dp_steps=3)  # few steps: a fast PLD
    rel = DpSgdEvent(**split["release"]["event"])
    assert (rel.sample_rate, rel.steps) == (0.1, 5)
    assert rel.noise_multiplier == pytest.approx(
        calibrate_noise_multiplier(10.0 * cfg["release_fraction"], 0.1, 5, bench.DELTA))
    assert cfg["second_moments"]  # the unit norm √2·bound
    assert split["release"]["noise_std"] == pytest.approx(
        rel.noise_multiplier * math.sqrt(2.0) * central_image_bound(28, 1, 2))
    dp = DpSgdEvent(**split["dp_sgd"]["event"])
    assert pld_epsilon([rel, dp], bench.DELTA) <= 10.0 * (1 + 1e-9)


def test_the_settings_table_keeps_its_invariants() -> None:
    keys = set(CPU)
    for scale, cfg in bench.SIZES.items():
        assert set(cfg) == keys, scale
        assert cfg["class_size"] * 10 == cfg["private_size"], scale
        assert 0.0 < cfg["release_fraction"] < 1.0
        assert 28 % cfg["downsample"] == 0
        assert cfg["dp_batch_size"] < cfg["private_size"]
        assert cfg["release_queries"] >= 1
        assert (cfg["release_sample_rate"] is None) == (cfg["release_queries"] == 1)
        assert cfg["headline_seeds"] >= 1 and cfg["headline_per_class"] >= 500
    # issue 18: CPU headline cells at 3 seeds, corpora of at least 5,000 images, 10,000
    # private images; gpu-smoke: all 60,000 private, 1 seed, 10,000-image corpora
    assert CPU["headline_seeds"] == 3 and 10 * CPU["headline_per_class"] >= 5000
    assert CPU["private_size"] == 10000 and CPU["test_size"] == 10000
    smoke = bench.SIZES["gpu-smoke"]
    assert smoke["private_size"] == 60000 and smoke["headline_seeds"] == 1
    assert 10 * smoke["headline_per_class"] == 10000
    assert bench.DELTA == 1e-5 and bench.EPSILONS == (1.0, 10.0)
    # the private set and the designer's slice are disjoint (and the test set is separate)
    private, designer = bench.split_indices(CPU)
    assert len(private) == 10000 and len(designer) == CPU["designer_validation_size"]
    assert not set(private.tolist()) & set(designer.tolist())
    np.testing.assert_array_equal(private, bench.split_indices(CPU)[0])  # seeded
    rows = {j["row"] for j in bench.jobs(CPU)}
    assert {"eps_0", "eps_1", "eps_10", "warmup_only_1", "warmup_only_10", "eps_inf",
            "dp_adam_cnn_1", "dp_adam_cnn_10", "dp_logreg_1", "dp_logreg_10"} <= rows
    headline = [j for j in bench.jobs(CPU) if j["kind"] == "generator"]
    assert len(headline) == 6 and {j["seed"] for j in headline} == {0, 1, 2}


def _micro_cfg() -> dict[str, Any]:
    return {**CPU, "private_size": 300, "class_size": 30, "designer_validation_size": 0,
            "test_size": 200,
            "unet": {**bench.CPU_UNET, "block_out_channels": [8, 8, 16]},
            "warmup_steps": 2, "warmup_batch_size": 10, "dp_batch_size": 30, "dp_steps": 1,
            "max_physical_batch_size": 30, "nonprivate_batch_size": 100,
            "sampler_steps": 2, "sample_batch_size": 50, "headline_seeds": 1,
            "headline_per_class": 2, "other_per_class": 2, "eps0_per_class": 2,
            "dpadam_seeds": 1, "dpadam_batch_size": 150, "logreg_batch_size": 150,
            "dpadam_epochs": 1, "logreg_epochs": 1, "workers": 1, "torch_threads": 1}


@pytest.mark.skipif(not FMNIST_DIR.exists(), reason="dataset-fashion-mnist not installed")
def test_a_micro_run_fills_every_kind_of_row_and_renders(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    threads = torch.get_num_threads()  # the run sets one thread (as its workers do)
    progress = tmp_path / "progress.json"  # what a time-limited device check keeps
    monkeypatch.setenv("BENCH_PROGRESS_FILE", str(progress))
    try:
        _micro_run()
    finally:
        torch.set_num_threads(threads)
    kept = json.loads(progress.read_text())
    assert kept["partial"] is True
    assert sorted(j["row"] for j in kept["done"]) == ["dp_logreg_1", "eps_1", "eps_inf"]


def _micro_run() -> None:
    keep = {"eps_1", "eps_inf", "dp_logreg_1"}  # a DP generator, the ∞ path, a direct row
    results = bench.run("cpu", cfg=_micro_cfg(), select=lambda j: j["row"] in keep)
    assert set(results["rows"]) == keep
    for key, row in results["rows"].items():
        acc = row["accuracy"]["mean"]
        assert 0.0 <= acc <= 1.0 and math.isfinite(acc), key
        assert row["devices"]["classifier"] in ("cpu", "cuda")
    assert results["rows"]["eps_1"]["corpus"] == 20
    assert results["rows"]["eps_1"]["devices"]["sampling"] == "cpu"
    assert results["settings"]["reduced"] is True
    assert set(results["accounting"]) == {"eps_1"}
    assert results["accounting"]["eps_1"]["composed_epsilon"] <= 1.0 * (1 + 1e-9)
    assert results["aims"]["eps_1"]["measured"] is not None
    assert results["aims"]["eps_10"]["measured"] is None  # not run here
    text = bench.table_markdown(results)
    assert "| 1 | central images + warm-up + DP-SGD |" in text
    assert "**Reduced run**" in text and "not measured" in text


def test_gpu_rows_only_when_every_recorded_phase_ran_on_cuda() -> None:
    from benchmarks.common import gpu_label

    cuda = {"device": "cuda"}
    rows = {"rows": [{"devices": {"training": "cuda:0", "sampling": "cuda:0"}}]}
    assert gpu_label(cuda, rows) == (True, "")
    mixed = {"rows": [{"devices": {"training": "cuda:0", "sampling": "cpu"}}]}
    assert gpu_label(cuda, mixed)[0] is False and "cpu" in gpu_label(cuda, mixed)[1]
    assert gpu_label(cuda, {"rows": [{"accuracy": 0.5}]})[0] is False  # nothing recorded
    assert gpu_label({"device": "cpu"}, rows)[0] is False
    untrained = {"rows": [{"devices": {"training": "none (untrained)", "sampling": "cuda"}}]}
    assert gpu_label(cuda, untrained) == (True, "")


def test_the_aims_follow_the_scale() -> None:
    rows = {key: {"accuracy": {"mean": acc}} for key, acc in (("eps_10", 0.75), ("eps_1", 0.65))}
    cpu = bench.aims(rows)
    assert cpu["eps_10"]["aim"] == 72.0 and cpu["eps_10"]["met"] is True
    smoke = bench.aims(rows, "gpu-smoke")  # issue 18: >= 80 % / >= 70 % on one GPU
    assert smoke["eps_10"] == {"aim": 80.0, "measured": 75.0, "met": False}
    assert smoke["eps_1"]["aim"] == 70.0 and smoke["eps_1"]["met"] is False
    assert bench.aims(rows, "gpu") == {}  # expected figures in docs, no aims
    # the gpu-smoke run measured on an H200 renders against the gpu-smoke aims
    measured = Path(__file__).parents[3] / "benchmarks/results/h200-2026-11-27b"
    written = json.loads((measured / "fmnist_no_public.gpu.json").read_text())
    results = written["results"]  # written before settings carried the scale
    results["settings"].setdefault("scale", written["scale"])
    text = bench.table_markdown(results)
    assert "at the gpu-smoke scale" in text and "aim ≥ 80" in text and "aim ≥ 70" in text
