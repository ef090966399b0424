"""Pure renderers of api bodies into text lines (unit-tested without a terminal)."""

from __future__ import annotations

from typing import Any

TIGHT_LABEL = "if the sequence had been fixed in advance; not a guarantee under adaptive use"
LOW_BUDGET_FRACTION = 0.1
DEFAULT_WARNING_FRACTION = 0.8


def _num(value: Any, fmt: str = ".4f") -> str:
    if value is None:
        return "-"
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return str(value)


def budget_warning(budget: dict[str, Any]) -> str | None:
    """The api's warning if it sent one, else ours when the budget is gone or nearly so.

    The api's ``warning`` is a flag (spent ≥ ``warning_fraction`` of the limit): it becomes a
    clear ``WARNING`` line with the figures.
    """
    if budget.get("warning") is True:
        return warning_text(budget.get("dataset_epsilon_spent"), budget.get("epsilon_limit"),
                            budget.get("warning_fraction"))
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


def warning_text(spent: Any, limit: Any, fraction: Any, *, after_job: bool = False) -> str:
    """``WARNING: ...``: the filter figure has reached the warning fraction of the limit."""
    share = float(fraction) if fraction is not None else DEFAULT_WARNING_FRACTION
    when = "after this job, spent" if after_job else "spent"
    return (f"WARNING: {when} (RDP filter) {_num(spent)} is at or above {share:.0%} of the "
            f"epsilon limit {_num(limit)}")


def spent_after_warning(result: dict[str, Any], budget: dict[str, Any] | None) -> str | None:
    """The submit/dry-run warning: the plan's ``dataset_epsilon_spent_after`` crosses the
    dataset's warning fraction of its limit (None otherwise, or without the figures)."""
    privacy = result.get("plan") or result.get("privacy") or {}
    after = privacy.get("dataset_epsilon_spent_after") if isinstance(privacy, dict) else None
    if after is None or not budget or budget.get("epsilon_limit") is None:
        return None
    fraction = budget.get("warning_fraction") or DEFAULT_WARNING_FRACTION
    if float(after) < float(fraction) * float(budget["epsilon_limit"]):
        return None
    return warning_text(after, budget["epsilon_limit"], fraction, after_job=True)
