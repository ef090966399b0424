"""benchmarks/audit_power.py at a tiny size: every claim, shape and variant gives a row with
both analyses, 2q is left out where it is not a rate, and the variants every analysis must
catch are far above the correct mechanism even here."""

from __future__ import annotations

import pytest

from benchmarks import audit_power

pytestmark = pytest.mark.unit


def test_a_tiny_power_run_fills_every_row() -> None:
    results = audit_power.run([300], repeats=1, seed=0)
    rows = results["rows"]
    assert len(rows) == len(audit_power.CLAIMS) * len(audit_power.SHAPES)
    for row in rows:
        assert (row["2q"] is None) == (row["sample_rate"] > 0.5)
        correct, silent = row["correct"][0], row["no noise"][0]
        assert silent["epsilon_delta"] > 2 * max(correct["epsilon_delta"], 0.5)
        assert silent["gdp_rejects_claim"] and not correct["gdp_rejects_claim"]
        assert row["claimed_mu"] > 0 and row["claimed_mu_epsilon"] >= row["claimed_epsilon"]
        assert 0 < row["max_certifiable"] < 6
        assert audit_power._line(row).startswith(f"| {row['claimed_epsilon']} (")
