"""Pure renderers of api bodies into text lines (unit-tested without a terminal)."""

from __future__ import annotations

from typing import Any

TIGHT_LABEL = "if the sequence had been fixed in advance; not a guarantee under adaptive use"
LOW_BUDGET_FRACTION = 0.1
DEFAULT_WARNING_FRACTION = 0.8


def number(value: Any, fmt: str = ".4f") -> str:
    """``value`` formatted with ``fmt``; ``-`` for None, the text itself for a non-number."""
    if value is None:
        return "-"
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return str(value)


_num = number


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
    """(label, value) rows of ``dpsynth budget``: every figure named apart (docs/privacy.md)."""
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


def model_privacy_lines(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of a DP model's figures, each named apart (issue 13, item 8):
    ``job_epsilon`` with its label when it composes DP ancestors (not a guarantee under
    adaptive use), and the guarantee beside it, the filter figure when the model was made."""
    if not model.get("dp"):
        return []
    label = model.get("job_epsilon_label")
    return [("job epsilon", _num(model.get("job_epsilon")) + (f"  ({label})" if label else "")),
            ("spent (RDP filter) when trained",
             f"{_num(model.get('dataset_epsilon_spent'))}  (the guarantee; the dataset's "
             "current figure: dpsynth budget)"),
            ("delta", _num(model.get("delta"), ".3e"))]


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


NON_DP_LINE = ("NON-DP, OWNER ONLY: computed from private records outside any DP mechanism "
               "(no epsilon charged; recorded in the ledger as a non-DP read); do not share")
PRDC_MEANING = {
    "precision": "share of synthetic inside the real k-NN manifold (fidelity)",
    "recall": "share of real inside the synthetic k-NN manifold (diversity)",
    "density": "about 1 for real-like samples (may exceed 1)",
    "coverage": "share of real with a synthetic neighbour (diversity)",
}
FD_NAME = "fd_dpsynth (Fréchet distance in the dpsynth feature network's space; not FID)"


def _chance_of(report: dict[str, Any], classifier: str) -> Any:
    """A classifier's chance accuracy from its scores (the same for both training sets)."""
    for score in report.get("classifiers") or []:
        if isinstance(score, dict) and score.get("classifier") == classifier:
            return score.get("chance")
    return None


def report_header(report: dict[str, Any]) -> list[str]:
    """The lines above the headline table: what was evaluated against what, and the NON-DP
    warning when the reference is private (the numbers come from private records). A held-out
    caveat (the platform could not verify the held-out records were never trained on) comes
    first: every number below depends on it."""
    caveat = report.get("holdout_caveat")
    lines = [f"HELD-OUT NOT VERIFIED: {caveat}"] if caveat else []
    lines += [f"evaluate job {report.get('job_id', '-')}: corpus "
             f"{report.get('corpus_artifact_id', '-')} (model {report.get('model_id') or '-'})"
             f" vs {report.get('reference_visibility', '?')} dataset "
             f"{report.get('dataset_id', '-')}"]
    sizes = report.get("sizes") or {}
    if sizes:
        lines.append("images: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    if report.get("non_dp"):
        lines.append(NON_DP_LINE)
    if report.get("contains_private_images"):
        lines.append("the HTML report shows private images (owner scope; never bundle it "
                     "with a corpus)")
    return lines


def report_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, value, compare with) rows of ``dpsynth report``, from the report's headline.

    Each figure stands beside what it must be read against: TSTR accuracy beside the same
    classifier trained on real data and chance; ``fd_dpsynth`` beside its floor (real train
    vs real held-out); the feature network's accuracy beside its threshold and its hash.
    """
    head: dict[str, Any] = report.get("headline") or {}
    rows: list[tuple[str, str, str]] = []
    tstr: dict[str, Any] = head.get("tstr_accuracy") or {}
    real: dict[str, Any] = head.get("real_accuracy") or {}
    for clf in sorted(set(tstr) | set(real)):
        rows.append((f"TSTR accuracy {clf} (train synthetic, test real)", _num(tstr.get(clf)),
                     f"trained on real {_num(real.get(clf))}, chance "
                     f"{_num(_chance_of(report, clf))}"))
    if head.get("fd_dpsynth") is not None or head.get("fd_dpsynth_real_train") is not None:
        floor = _num(head.get("fd_dpsynth_real_train"), ".3f")
        rows.append((FD_NAME, _num(head.get("fd_dpsynth"), ".3f"),
                     f"floor (real train vs held-out) {floor}; lower is closer"))
    if head.get("inception_fid") is not None:
        rows.append(("Inception FID (pinned pytorch-fid weights)",
                     _num(head["inception_fid"], ".3f"), ""))
    for name, meaning in PRDC_MEANING.items():
        if head.get(name) is not None:
            rows.append((name, _num(head[name]), meaning))
    if head.get("memorisation_flagged") is not None:
        total = next((m.get("synthetic") for m in report.get("memorisation") or []
                      if isinstance(m, dict) and m.get("synthetic") is not None),
                     (report.get("sizes") or {}).get("synthetic"))
        flagged = int(head["memorisation_flagged"])
        rows.append(("memorisation: flagged synthetic images",
                     f"{flagged}" + (f" of {total}" if total is not None else ""),
                     "much closer to a training image than to any held-out one"
                     + ("  ← CHECK THE CLOSEST PAIRS" if flagged else "")))
    if head.get("memorisation_fraction_closer_to_train") is not None:
        rows.append(("memorisation: fraction closer to train",
                     _num(head["memorisation_fraction_closer_to_train"]),
                     "about 0.5 x (1 + train share) when nothing is memorised"))
    net = report.get("feature_network")
    if isinstance(net, dict):
        verdict = "passed" if net.get("passed") else "FAILED"
        rows.append(("feature network accuracy (public validation)", _num(net.get("accuracy")),
                     f"threshold {_num(net.get('threshold'))}, {verdict}; "
                     f"{net.get('validation_size', '?')} images of public dataset "
                     f"{net.get('dataset_id', '-')}"))
        sha = str(net.get("sha256") or "-")
        rows.append(("feature network sha256", sha[:16] + ("…" if len(sha) > 16 else ""),
                     f"{net.get('architecture', '-')}, model {net.get('model_id', '-')} "
                     "(full hash below)"))
    return rows


def report_footer(report: dict[str, Any]) -> list[str]:
    """The lines below the table: the feature network's full weights hash (to compare with
    the model's) and the report's notes."""
    lines = []
    net = report.get("feature_network")
    if isinstance(net, dict) and net.get("sha256"):
        lines.append(f"feature network weights sha256: {net['sha256']}")
    lines.extend(f"note: {note}" for note in report.get("notes") or [])
    return lines
