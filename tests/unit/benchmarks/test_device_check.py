"""scripts/device_check.sh --tiny: the GPU check's identical code path on the CPU (tiny
preset, batch 4, 2 rounds), run as make test would, with the repository's Python. It must
leave device.json, a measured row per (trainable set, engine that builds) and a summary with
positive ratios, and phase_throughput.json with every ML phase measured on the CPU (issue 18);
what a GPU would measure is not asserted (benchmarks measure, tests check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common import ROOT
from benchmarks.engine_cost import ENGINES, NONDP, ROWS_FILE, TRAINABLES, read_rows
from benchmarks.phase_throughput import OUT_FILE, PHASES

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "scripts" / "device_check.sh"


def test_device_check_tiny_writes_device_rows_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "device-check"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}"}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "--tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall < 90, f"--tiny took {wall:.0f} s"

    # the GPU tests ran (and, without CUDA, skipped cleanly: none failed or errored)
    tests_log = (out / "pytest_gpu.log").read_text()
    assert "skipped" in tests_log and " failed" not in tests_log and "error" not in tests_log

    device = json.loads((out / "device.json").read_text())
    assert device["hostname"] and device["python"]
    assert device["torch"]["version"] and "cuda_available" in device["torch"]
    assert device["imports"]["dpsynth_ml.dp.engine"] == "ok"

    rows = read_rows(out / ROWS_FILE)
    assert rows and all(r["device"] == "cpu" for r in rows)
    built = {name for name in ENGINES
             if any(r["engine"] == name and r["status"] == "ok" for r in rows)}
    assert "hooks" in built  # the production engine always builds
    for name in set(ENGINES) - built:  # an engine that does not build is a row with a reason
        assert all(r["status"] != "ok" and r.get("reason") for r in rows if r["engine"] == name)
    for trainable in TRAINABLES:
        for engine in (NONDP, *built):
            measured = [r for r in rows if r["trainable"] == trainable
                        and r["engine"] == engine and r["status"] == "ok"]
            assert measured, (trainable, engine)
            assert all(r["step_s_median"] > 0 and r["batch"] == 4 for r in measured)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["profile"] == "tiny" and summary["settings"]["pairs"] == 2
    assert summary["machine"]["hostname"] == device["hostname"]
    for trainable in TRAINABLES:
        entry = summary["trainables"][trainable]
        assert entry["best"]["engine"] in built
        for engine in built:
            ratios = entry["engines"][engine]
            assert ratios["time_ratio"]["median"] > 0 and ratios["cpu_ratio"]["median"] > 0
            assert ratios["pairs"] >= 1
    assert "best:" in proc.stdout  # the human summary at the end

    phases = json.loads((out / OUT_FILE).read_text())
    assert phases["profile"] == "tiny" and phases["device"] == "cpu"
    assert set(phases["phases"]) == set(PHASES)
    for name, row in phases["phases"].items():  # each ran, on the device it says it ran on
        assert row["status"] == "ok", (name, row)
        assert row["device"] == row["requested_device"] == "cpu"
        assert row["images_per_second"] > 0, (name, row)
    assert "gpu-smoke" not in proc.stdout  # never with --tiny
