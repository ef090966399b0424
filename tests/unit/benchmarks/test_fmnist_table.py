"""benchmarks/fmnist_table.py: the three blocks' cells, the public split's disjointness from
the private set and the designer's slice, the aims' arithmetic, the synthetic validation
split, and a micro-run of every block (skipped without Debian's dataset-fashion-mnist)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks import fmnist_no_public as nopub
from benchmarks import fmnist_table as table
from benchmarks import fmnist_table_long as long_table
from benchmarks.fmnist_privacy_utility import FMNIST_DIR

CPU = table.settings("cpu")


def test_every_block_has_the_issues_rows_and_the_headline_seeds() -> None:
    cells = table.jobs(CPU)
    rows = {j["row"] for j in cells}
    for block in table.BLOCKS:
        assert {f"{block}/eps_{e}" for e in ("0", "1", "10", "inf")} <= rows, block
    assert {"no_public/warmup_only_1", "no_public/warmup_only_10",
            "no_public/dp_adam_cnn_10", "no_public/dp_logreg_1", "no_public/real"} <= rows
    for block in table.PUBLIC_BLOCKS:  # direct DP-Adam with the same public data
        assert {f"{block}/public_cnn", f"{block}/dp_adam_public_1",
                f"{block}/dp_adam_public_10"} <= rows
    headline = [j for j in cells if j["kind"] == "generator" and j["epsilon"] == 10.0]
    assert {j["block"] for j in headline} == set(table.BLOCKS)
    # the public blocks' generator cells start from the block's model and warm up less
    for j in cells:
        if j["block"] in table.PUBLIC_BLOCKS and j["kind"] in ("generator", "eps_inf"):
            assert "base_model" in j
            assert j["overrides"] == {"warmup_steps": CPU["public_warmup_steps"]}
    # the longest cells first, the direct rows last
    kinds = [j["kind"] for j in cells]
    assert kinds.index("generator") < kinds.index("eps_0") < kinds.index("public_cnn")
    # bench-long: every generator cell at 3 seeds with 5,000-image corpora
    long_cfg = {**CPU, **long_table.OVERRIDES}
    for row in ("no_public/eps_1", "ood/eps_1", "in_dist/eps_inf", "in_dist/eps_10",
                "no_public/warmup_only_10", "ood/dp_adam_public_10"):
        seeds = {j["seed"] for j in table.jobs(long_cfg) if j["row"] == row}
        assert seeds == {0, 1, 2}, row
    assert all(j.get("per_class", 500) >= 500 for j in table.jobs(long_cfg))


def test_the_public_split_is_disjoint_from_the_private_set_and_the_designer_slice() -> None:
    private, designer = nopub.split_indices(CPU)
    public = table.public_indices(CPU)
    assert len(public) == CPU["public_size"] == 10000
    assert not set(public.tolist()) & set(private.tolist())
    assert not set(public.tolist()) & set(designer.tolist())
    np.testing.assert_array_equal(public, table.public_indices(CPU))  # seeded


def test_only_the_cpu_scale_has_three_blocks() -> None:
    with pytest.raises(SystemExit, match="fmnist_no_public"):
        table.settings("gpu-smoke")


def _row(acc: float) -> dict[str, Any]:
    return {"accuracy": {"mean": acc, "std": 0.0, "values": [acc], "seeds": 1}}


def test_the_aims_arithmetic() -> None:
    rows = {"ood/eps_0": _row(0.10), "ood/eps_10": _row(0.50),
            "in_dist/eps_0": _row(0.60), "in_dist/eps_inf": _row(0.80),
            "in_dist/eps_10": _row(0.66), "no_public/eps_10": _row(0.73),
            "no_public/warmup_only_10": _row(0.70)}
    got = table.aims(rows)
    assert got["ood/gain_10"]["measured"] == pytest.approx(40.0) and got["ood/gain_10"]["met"]
    gap = got["in_dist/gap_closed_10"]
    assert gap["measured"] == pytest.approx(0.3) and gap["met"] is False
    assert got["no_public/eps_10"]["met"] and got["no_public/dpsgd_adds_10"]["met"] is False
    assert got["no_public/eps_1"]["measured"] is None
    # no gap to close: not met, and said why
    rows["in_dist/eps_inf"] = _row(0.55)
    gap = table.aims(rows)["in_dist/gap_closed_10"]
    assert gap["met"] is False and "no gap" in gap["note"]


def test_the_synthetic_validation_split_is_stratified_disjoint_and_seeded() -> None:
    labels = np.repeat(np.arange(10), 50)
    train, val = nopub.synthetic_validation_split(labels, 0.1, seed=3)
    assert len(val) == 50 and len(train) == 450
    assert not set(train.tolist()) & set(val.tolist())
    assert np.bincount(labels[val], minlength=10).tolist() == [5] * 10
    again = nopub.synthetic_validation_split(labels, 0.1, seed=3)
    np.testing.assert_array_equal(val, again[1])
    assert not np.array_equal(val, nopub.synthetic_validation_split(labels, 0.1, seed=4)[1])
    # a class of one image stays in training
    tr, va = nopub.synthetic_validation_split(np.array([0, 0, 0, 1]), 0.5, seed=0)
    assert 3 in tr.tolist() and 3 not in va.tolist()


def _micro_cfg() -> dict[str, Any]:
    return {**CPU, "private_size": 300, "class_size": 30, "designer_validation_size": 0,
            "test_size": 200, "public_size": 200,
            "unet": {**nopub.CPU_UNET, "block_out_channels": [8, 8, 16]},
            "warmup_steps": 2, "public_warmup_steps": 2, "warmup_batch_size": 10,
            "dp_batch_size": 30, "dp_steps": 1, "max_physical_batch_size": 30,
            "nonprivate_batch_size": 100, "sampler_steps": 2, "sample_batch_size": 50,
            "headline_per_class": 2, "other_per_class": 2, "eps0_per_class": 2,
            "public_headline_per_class": 2, "public_other_per_class": 2,
            "pretrain_epochs": {"ood": 1, "in_dist": 1}, "dpadam_batch_size": 150,
            "logreg_batch_size": 150, "dpadam_epochs": 1, "logreg_epochs": 1, "workers": 1,
            "torch_threads": 1}


@pytest.mark.skipif(not FMNIST_DIR.exists(), reason="dataset-fashion-mnist not installed")
def test_a_micro_run_of_every_block_renders(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("DPSYNTH_PRETRAIN_CACHE", str(tmp_path / "cache"))
    keep = {"no_public/eps_1", "ood/eps_0", "ood/eps_10", "in_dist/eps_inf",
            "in_dist/dp_adam_public_1"}
    threads = torch.get_num_threads()
    try:
        results = table.run("cpu", cfg=_micro_cfg(), select=lambda j: j["row"] in keep)
    finally:
        torch.set_num_threads(threads)
    assert set(results["rows"]) == keep
    for key, row in results["rows"].items():
        acc = row["accuracy"]["mean"]
        assert 0.0 <= acc <= 1.0 and math.isfinite(acc), key
    assert set(results["pretraining"]) == {"ood", "in_dist"}
    assert results["pretraining"]["ood"]["images"] == 1797
    assert results["pretraining"]["ood"]["cache"] == "miss"
    assert results["rows"]["ood/eps_0"]["devices"]["training"].startswith("none (the public")
    # the synthetic rows select their epoch on a synthetic split, the direct rows do not
    sel = results["rows"]["ood/eps_10"]["cells"][0]["selection"]
    assert sel is not None and 1 <= sel["epoch"] <= sel["epochs"]
    assert sel["validation_size"] == 10  # at least one image of each class of two
    assert "selection" not in results["rows"]["in_dist/dp_adam_public_1"]["cells"][0]
    assert results["accounting"]["eps_10"]["composed_epsilon"] <= 10.0 * (1 + 1e-9)
    assert set(results["aims"]) >= {"ood/gain_10", "in_dist/gap_closed_10"}
    text = table.table_markdown(results)
    assert "| out-of-distribution public data (digits) | 0 |" in text
    assert "**Reduced run**" in text and "synthetic validation" in text
    assert "1,797 images × 1 epochs" in text
