"""benchmarks/audit_power.py at a tiny size: every claim, shape, score and variant gives a
row, 2q is left out where it is not a rate, and the variants the audit must catch are far
above the correct mechanism even here."""

from __future__ import annotations

import pytest

from benchmarks import audit_power

pytestmark = pytest.mark.unit


def test_a_tiny_power_run_fills_every_row() -> None:
    results = audit_power.run([300], repeats=1, seed=0)
    rows = results["rows"]
    assert len(rows) == len(audit_power.CLAIMS) * len(audit_power.SHAPES) * 2
    for row in rows:
        assert (row["2q"] is None) == (row["sample_rate"] > 0.5)
        assert row["no noise"][0] > 2 * max(row["correct"][0], 0.5)
        assert 0 < row["max_certifiable"] < 6
        assert audit_power._line(row).startswith(f"| {row['claimed_epsilon']} |")
