"""The engine step-cost harness's own logic (benchmarks/engine_cost.py): pairing rounds into
ratios, medians and spreads, the best engine, the budget cut, and an engine that cannot be
built becoming a row instead of a crash. Synthetic numbers: nothing here times anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import engine_cost
from benchmarks.engine_cost import (
    NONDP,
    ROWS_FILE,
    SUMMARY_FILE,
    measure_one,
    read_rows,
    run_rounds,
    spread,
    summarize_rows,
)

pytestmark = pytest.mark.unit


def _row(trainable: str, engine: str, round_: int, step: float, mem: float | None,
         cpu: float | None = None, status: str = "ok", device: str = "cpu") -> dict[str, Any]:
    row: dict[str, Any] = {"trainable": trainable, "engine": engine, "round": round_,
                           "status": status, "device": device}
    if status == "ok":
        row |= {"step_s_median": step, "cpu_s_median": step if cpu is None else cpu,
                "peak_mem_mib": mem, "trainable_parameters": 100}
    else:
        row["reason"] = "ImportError: no module"
    return row


def test_spread_is_median_min_max_count() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert spread([]) is None


def test_ratios_are_taken_within_each_round_then_the_median() -> None:
    # the machine slows down 2x in round 1: per-round ratios stay 1.5, a pooled median would not
    rows = [_row("full", NONDP, 0, 1.0, 100.0), _row("full", "hooks", 0, 1.5, 150.0),
            _row("full", NONDP, 1, 2.0, 100.0), _row("full", "hooks", 1, 3.0, 120.0),
            _row("full", NONDP, 2, 1.0, 100.0), _row("full", "hooks", 2, 1.2, 200.0)]
    hooks = summarize_rows(rows)["trainables"]["full"]["engines"]["hooks"]
    assert hooks["pairs"] == 3
    assert hooks["time_ratio"] == {"median": 1.5, "min": 1.2, "max": 1.5, "n": 3}
    assert hooks["mem_ratio"] == {"median": 1.5, "min": 1.2, "max": 2.0, "n": 3}
    assert hooks["step_s_nondp"] == 1.0 and hooks["step_s_dp"] == 1.5
    assert hooks["status"] == "ok"


def test_unpaired_rounds_and_missing_memory_are_left_out() -> None:
    rows = [_row("attention", NONDP, 0, 1.0, None), _row("attention", "hooks", 0, 1.1, 5.0),
            _row("attention", "hooks", 1, 9.0, 5.0),  # round 1 has no non-DP row
            _row("attention", NONDP, 2, 1.0, 0.0), _row("attention", "hooks", 2, 1.3, 5.0)]
    hooks = summarize_rows(rows)["trainables"]["attention"]["engines"]["hooks"]
    assert hooks["pairs"] == 2
    assert hooks["time_ratio"]["median"] == pytest.approx(1.2)
    assert hooks["mem_ratio"] is None  # no usable non-DP memory figure: no ratio, not 0 or inf


def test_best_engine_per_set_and_unavailable_engines() -> None:
    rows = [_row("lora", NONDP, 0, 1.0, 10.0), _row("lora", "hooks", 0, 1.4, 12.0),
            _row("lora", "bookkeeping", 0, 1.05, 11.0),
            _row("full", NONDP, 0, 1.0, 10.0), _row("full", "hooks", 0, 1.7, 14.0),
            _row("full", "bookkeeping", 0, 0.0, None, status="unavailable")]
    summary = summarize_rows(rows)
    assert list(summary["trainables"]) == ["full", "lora"]  # TRAINABLES order
    assert summary["trainables"]["lora"]["best"]["engine"] == "bookkeeping"
    full = summary["trainables"]["full"]
    assert full["best"]["engine"] == "hooks"
    assert full["engines"]["bookkeeping"]["status"] == "unavailable"
    assert "ImportError" in full["engines"]["bookkeeping"]["reason"]
    assert full["engines"]["bookkeeping"]["time_ratio"] is None


def test_targets_cpu_judges_cpu_time_cuda_wall_time() -> None:
    cpu = summarize_rows([_row("full", NONDP, 0, 1.0, 100.0, cpu=1.0),
                          _row("full", "hooks", 0, 3.0, 140.0, cpu=1.7)])
    assert cpu["trainables"]["full"]["engines"]["hooks"]["meets_target"] is True
    cuda = summarize_rows([_row("full", NONDP, 0, 1.0, 100.0, cpu=1.0, device="cuda"),
                           _row("full", "hooks", 0, 1.25, 130.0, cpu=1.0, device="cuda")])
    assert cuda["device"] == "cuda"
    assert cuda["trainables"]["full"]["engines"]["hooks"]["meets_target"] is False  # memory
    no_aim = summarize_rows([_row("lora", NONDP, 0, 1.0, 1.0), _row("lora", "hooks", 0, 2, 1)])
    assert no_aim["trainables"]["lora"]["engines"]["hooks"]["meets_target"] is None


def _settings(pairs: int) -> dict[str, Any]:
    return dict(engine_cost.PROFILES["tiny"]) | {"pairs": pairs}


def test_rounds_interleave_and_write_each_row_as_it_comes(tmp_path: Path) -> None:
    seen: list[tuple[str, str, int]] = []

    def child(config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # the rows file already holds every earlier process when the next one starts
        assert len(read_rows(tmp_path / ROWS_FILE)) == len(seen)
        seen.append((config["trainable"], config["engine"], config["seed"]))
        if config["engine"] == "bookkeeping":
            return {"engine": "bookkeeping", "trainable": config["trainable"],
                    "device": "cpu", "status": "unavailable", "reason": "ImportError"}
        step = 2.0 if config["engine"] == "hooks" else 1.0
        return _row(config["trainable"], config["engine"], 0, step, 10.0 * step) | {
            "process_wall_s": 0.01}

    summary = run_rounds(_settings(3), tmp_path, trainables=["full", "lora"],
                         engines=["hooks", "bookkeeping"], child=child)
    # round 0: every engine once; bookkeeping is then dropped, hooks stays paired with nondp
    assert seen[:6] == [("full", NONDP, 0), ("full", "hooks", 0), ("full", "bookkeeping", 0),
                        ("lora", NONDP, 0), ("lora", "hooks", 0), ("lora", "bookkeeping", 0)]
    assert seen[6:] == [("full", NONDP, 1), ("full", "hooks", 1), ("lora", NONDP, 1),
                        ("lora", "hooks", 1), ("full", NONDP, 2), ("full", "hooks", 2),
                        ("lora", NONDP, 2), ("lora", "hooks", 2)]
    rows = read_rows(tmp_path / ROWS_FILE)
    assert len(rows) == 14 and [r["round"] for r in rows[-2:]] == [2, 2]
    assert summary["rounds_done"] == 3 and summary["cut"] is False
    assert summary["trainables"]["full"]["engines"]["hooks"]["time_ratio"]["n"] == 3
    on_disk = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert on_disk["trainables"]["lora"]["engines"]["bookkeeping"]["status"] == "unavailable"


def test_the_budget_stops_before_a_process_that_would_not_fit(tmp_path: Path) -> None:
    clock = [0.0]

    def child(config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert timeout_s <= 100.0
        clock[0] += 10.0  # every process takes 10 s
        return _row(config["trainable"], config["engine"], 0, 1.0, 1.0) | {
            "process_wall_s": 10.0}

    summary = run_rounds(_settings(7), tmp_path, trainables=["full"], engines=["hooks"],
                         budget_s=100.0, child=child, clock=lambda: clock[0])
    # the 9th process starts at t=80 s (20 s left >= its 12 s estimate); the 10th, at 90 s,
    # would end after 100 s: it never starts, and the unpaired 9th adds no ratio
    assert len(read_rows(tmp_path / ROWS_FILE)) == 9
    assert summary["cut"] is True and summary["rounds_done"] == 4
    assert summary["trainables"]["full"]["engines"]["hooks"]["pairs"] == 4


def test_an_engine_that_does_not_import_is_a_row_not_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engine_cost.ENGINES, "missing", ("dpsynth_ml.dp.no_such_engine", "X"))
    config = {k: engine_cost.PROFILES["tiny"][k] for k in (
        "device", "preset", "image_size", "batch", "warmup", "measured", "lora_rank",
        "threads")} | {"engine": "missing", "trainable": "attention"}
    row = measure_one(config)
    assert row["status"] == "unavailable"
    assert "ModuleNotFoundError" in row["reason"]


@pytest.mark.parametrize("engine", [NONDP, "bookkeeping"])
def test_a_logical_step_of_several_micro_batches_draws_the_noise_once(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth_ml.dp.noise import ChaChaGaussian

    draws: list[int] = []
    real = ChaChaGaussian.gaussian

    def counting(self: ChaChaGaussian, shape: Any, std: float, **kwargs: Any) -> Any:
        draws.append(1)
        return real(self, shape, std, **kwargs)

    monkeypatch.setattr(ChaChaGaussian, "gaussian", counting)
    config = {k: engine_cost.PROFILES["tiny"][k] for k in (
        "device", "preset", "image_size", "batch", "warmup", "measured", "lora_rank",
        "threads")} | {"engine": engine, "trainable": "lora", "micro_batches": 3}
    row = measure_one(config)
    assert row["status"] == "ok", row
    assert row["micro_batches"] == 3
    steps = config["warmup"] + config["measured"]
    assert len(draws) == (0 if engine == NONDP else steps)  # one draw per logical step


def test_the_spawn_launcher_runs_one_configuration_in_a_new_interpreter() -> None:
    # the fallback when CUDA cannot be used in a forked child: `--one` in a fresh python
    config = {k: engine_cost.PROFILES["tiny"][k] for k in (
        "device", "preset", "image_size", "batch", "warmup", "measured", "lora_rank",
        "threads")} | {"engine": "hooks", "trainable": "lora"}
    row = engine_cost.run_child(config, 120.0)
    assert row["status"] == "ok", row
    assert row["launcher"] == "spawn" and row["step_s_median"] > 0
    assert row["trainable_parameters"] > 0 and row["peak_method"] == "VmHWM (reset)"


def test_dp_overhead_renders_the_engine_rows_and_old_results_without_them() -> None:
    from benchmarks.dp_overhead import table_markdown

    mode = {"trainable_parameters": 10, "step_s_nondp": 1.0, "step_s_dp": 2.0,
            "time_ratio": 2.0, "cpu_ratio": 2.0, "peak_mem_mib_nondp": 1.0,
            "peak_mem_mib_dp": 2.0, "mem_ratio": 2.0}
    settings = {"preset": "small", "image_size": 32, "batch": 16, "warmup": 2, "measured": 8,
                "lora_rank": 4, "threads": 1}
    old = {"settings": settings, "modes": {"full": mode}}
    assert "Per engine" not in table_markdown(old)  # a results file from before issue 17
    rows = [_row("full", NONDP, r, 1.0, 10.0) for r in range(7)]
    rows += [_row("full", "hooks", r, 1.5 + r / 100, 12.0) for r in range(7)]
    rows += [_row("full", "bookkeeping", 0, 0.0, None, status="unavailable")]
    engines = summarize_rows(rows) | {"settings": {"batch": 16, "device": "cpu", "pairs": 7},
                                      "rounds_done": 7, "cut": False}
    table = table_markdown(old | {"engines": engines})
    assert "| `full` | **`hooks`** | 7 | 1.53x [1.50–1.56] |" in table
    assert "| `full` | `bookkeeping` | 0 | unavailable: ImportError: no module |" in table
    assert "7 rounds of 7." in table
    assert "one micro-batch of 16" in table
    # the second run: full at the default logical batch, and the product path's engine
    logical = engines | {"settings": {"batch": 16, "micro_batches": 16, "device": "cpu",
                                      "pairs": 5}}
    both = table_markdown(old | {"modes": {"full": mode | {"dp_engine": "bookkeeping"}},
                                 "engines": engines, "engines_logical": logical})
    assert "| `full` (bookkeeping) | 10 |" in both
    assert "a logical batch of 256 = 16 micro-batches of 16, one noise draw" in both
    assert both.count("| `full` | **`hooks`** |") == 2
