"""The service-load benchmark's zero-overspend replay and the docs renderer: correctness of
the checks themselves (a check that cannot fail proves nothing). No platform, no timing."""

from __future__ import annotations

import pytest
from dpsynth_ledger.accounting.rdp import rdp_step

from benchmarks.render_docs import render, split_notes
from benchmarks.service_load import replay_export, sampled_gaussian_rdp

pytestmark = pytest.mark.unit

SIGMA, Q, ORDER = 1.2, 0.1, 4


def _export(*events: tuple[str, dict], rdp_budget: float) -> dict:
    entries = [{"kind": "budget_created",
                "payload": {"admission_order": ORDER, "rdp_budget": rdp_budget}}]
    for kind, payload in events:
        entries.append({"kind": kind, "payload": payload})
    return {"entries": entries}


def _accepted(rid: str, steps: int) -> tuple[str, dict]:
    return ("reservation_accepted", {"reservation_id": rid, "steps": steps, "event": {
        "noise_multiplier": SIGMA, "sample_rate": Q, "steps": steps}})


@pytest.mark.parametrize(("sigma", "q", "order"), [(1.2, 0.1, 4), (4.0, 0.16, 8),
                                                   (0.8, 0.02, 32), (2.0, 1.0, 6)])
def test_replay_rdp_matches_the_ledger_accountant(sigma, q, order):
    ours = sampled_gaussian_rdp(sigma, q, order)
    assert ours == pytest.approx(rdp_step(sigma, q, order), rel=1e-9)


def test_replay_within_budget_with_leases_and_closes():
    per_step = sampled_gaussian_rdp(SIGMA, Q, ORDER)
    export = _export(_accepted("a", 10), _accepted("b", 10),
                     ("read_grant", {"reservation_id": "a"}),
                     ("lease_granted", {"reservation_id": "a", "steps": 4}),
                     ("reservation_closed", {"reservation_id": "a"}),
                     ("reservation_refused", {"reservation_id": "c"}),
                     rdp_budget=25 * per_step)
    out = replay_export(export)
    assert out["rdp_committed"] == pytest.approx(4 * per_step)
    assert out["rdp_reserved"] == pytest.approx(10 * per_step)  # b open, a closed
    assert out["rdp_peak_committed_plus_reserved"] == pytest.approx(20 * per_step)
    assert not out["overspend"]


def test_replay_flags_an_overspend_even_if_it_is_released_later():
    per_step = sampled_gaussian_rdp(SIGMA, Q, ORDER)
    export = _export(_accepted("a", 10), _accepted("b", 10),
                     ("reservation_closed", {"reservation_id": "b"}),
                     rdp_budget=15 * per_step)
    out = replay_export(export)
    assert out["rdp_reserved"] == pytest.approx(10 * per_step)
    assert out["overspend"]  # the peak (20 steps' worth) exceeded the budget


def test_replay_refuses_unknown_entry_kinds():
    with pytest.raises(ValueError, match="does not know"):
        replay_export(_export(("budget_recharged", {}), rdp_budget=1.0))


def test_render_replaces_only_marked_blocks_and_is_idempotent():
    text = "intro prose\n<!-- bench:weak:start -->\nSTALE-TABLE\n<!-- bench:weak:end -->\noutro\n"
    once, names = render(text)
    twice, _ = render(once)
    assert names == ["weak"]
    assert once == twice
    assert once.startswith("intro prose\n") and once.endswith("outro\n")
    assert "STALE-TABLE" not in once


def test_render_rejects_unbalanced_markers():
    with pytest.raises(SystemExit):
        render("<!-- bench:weak:start -->\nno end\n")


def test_split_notes_takes_the_slow_or_weak_section_out():
    notes = "## Notes\nsetting A\n\n### What is slow or weak\n- slow thing\n\n## Later\nmore\n"
    body, weak = split_notes(notes)
    assert weak == "- slow thing"
    assert "slow thing" not in body
    assert "setting A" in body and "more" in body
