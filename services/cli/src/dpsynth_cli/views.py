"""Pure renderers of api bodies into text lines (unit-tested without a terminal)."""

from __future__ import annotations

from typing import Any

TIGHT_LABEL = "if the sequence had been fixed in advance; not a guarantee under adaptive use"
LOW_BUDGET_FRACTION = 0.1


def _num(value: Any, fmt: str = ".4f") -> str:
    if value is None:
        return "-"
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return str(value)


def budget_warning(budget: dict[str, Any]) -> str | None:
    """The api's warning if it sent one, else ours when the budget is gone or nearly so."""
    if budget.get("warning"):
        return str(budget["warning"])
    limit, remaining = budget.get("epsilon_limit"), budget.get("dataset_epsilon_remaining")
    if limit is None or remaining is None:
        return None
    if float(remaining) <= 0:
        return "budget exhausted: no further DP job on this dataset can be admitted"
    if float(remaining) < LOW_BUDGET_FRACTION * float(limit):
        return f"less than {LOW_BUDGET_FRACTION:.0%} of the budget remains"
    return None


def budget_lines(budget: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of ``dpsynth budget``: every figure named apart (DESIGN §3)."""
    tight_label = budget.get("dataset_tight_epsilon_label") or TIGHT_LABEL
    rows = [
        ("dataset", str(budget.get("dataset_id", "-"))),
        ("epsilon limit", _num(budget.get("epsilon_limit"))),
        ("spent (RDP filter)", _num(budget.get("dataset_epsilon_spent"))),
        ("tight (PLD)", f"{_num(budget.get('dataset_tight_epsilon'))}  ({tight_label})"),
        ("reserved", _num(budget.get("dataset_epsilon_reserved"))),
        ("remaining", _num(budget.get("dataset_epsilon_remaining"))),
        ("admission order", str(budget.get("admission_order", "-"))),
        ("delta", _num(budget.get("delta"), ".3e")),
    ]
    if budget.get("accountant"):
        rows.append(("accountant", str(budget["accountant"])))
    warning = budget_warning(budget)
    if warning:
        rows.append(("warning", warning))
    return rows


def progress_text(job: dict[str, Any]) -> str:
    """One line of data-independent progress: state, step/total, epsilon so far, ETA."""
    p = job.get("progress") or {}
    parts = [f"{job.get('state', '?')}", f"step {p.get('step', 0)}/{p.get('total', 0) or '?'}"]
    if p.get("epsilon_so_far") is not None:
        parts.append(f"epsilon so far {_num(p['epsilon_so_far'], '.3f')}")
    if p.get("eta_s") is not None:
        parts.append(f"ETA {_num(p['eta_s'], '.0f')}s")
    return "  ".join(parts)
