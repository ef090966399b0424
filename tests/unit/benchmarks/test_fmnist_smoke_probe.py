"""The gpu-smoke sizing probe (benchmarks/fmnist_smoke_probe.py) runs its every row on the
CPU with a small UNet and writes them as it goes; on a GPU it is the same code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import fmnist_smoke_probe as probe


def test_the_tiny_probe_writes_every_kind_of_row(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        doc = probe.run(tmp_path, budget_s=120.0, tiny=True)
    finally:
        torch.set_num_threads(threads)
    kinds = [r["kind"] for r in doc["rows"]]
    assert kinds == ["dp_step", "warmup", "sampling", "classifier"]
    bad = [r for r in doc["rows"] if r["status"] != "ok"]
    assert not bad, bad
    written = json.loads((tmp_path / "smoke_probe.json").read_text())
    assert [r["kind"] for r in written["rows"]] == kinds
    step = doc["rows"][0]
    assert step["device_ran"] == "cpu" and step["s_per_step"] > 0
    assert doc["rows"][3]["dp_adam_images"] == 600


@pytest.mark.parametrize("argv", [["--out"], []])
def test_the_probe_needs_an_out_folder(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        probe.main(argv)
