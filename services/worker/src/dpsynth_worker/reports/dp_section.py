"""The report's privacy sections: the DP evaluation and selection sections (issue 13, item
6), the held-out caveat and the note on which ε is the guarantee (issue 15, items 4 and 8),
and the empirical audit of the finetune behind the corpus's model (issue 19, item 2).

A held-out caveat (the held-out records could not all be checked against the model
lineage's training data) comes first; then a DP evaluation's released numbers (labelled DP,
with ε, δ, σ and the public N̂_h); then the selection caveat of a report on private data: its
non-DP numbers are not covered by the released epsilon if a corpus is chosen by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from dpsynth_shared.audit_specs import AUDIT_VERDICT_WORDS


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return escape(str(value))


def dp_section(doc: Mapping[str, Any]) -> str:
    """The DP release of the job, or "" without one."""
    dp: Mapping[str, Any] | None = doc.get("dp_evaluation")
    if not dp:
        return ""
    metrics: Mapping[str, Mapping[str, Any]] = dp.get("metrics") or {}
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{_fmt(v.get('accuracy'))}</td>"
        f"<td>{_fmt(v.get('accuracy_clipped'))}</td></tr>" for name, v in metrics.items())
    terms = " · ".join(f"{escape(k)} {_fmt(dp.get(key))}" for k, key in (
        ("ε", "epsilon"), ("δ", "delta"), ("σ", "sigma"), ("sensitivity", "sensitivity"),
        ("N̂_h (public held-out size)", "holdout_size"), ("partition", "partition")))
    return ('<section><h2>DP evaluation (inside the guarantee)</h2>'
            '<div class="banner public">DP — shown to the job\'s readers — '
            f"{terms}<small>{escape(str(dp.get('statement', '')))}</small></div>"
            "<table><thead><tr><th>metric</th><th>released (DP)</th><th>clipped to [0, 1]"
            f"</th></tr></thead><tbody>{rows}</tbody></table></section>")


EPSILON_NOTE = ('<p class="note"><small>Which ε is the guarantee: the dataset\'s spent '
                '(filter) figure. The job ε is the model\'s standalone figure and the tight '
                "figure is not a guarantee under adaptive use; every ε is explained in "
                "dpsynth's docs/epsilons.md.</small></p>")
"""Under the privacy cards: which figure to rely on, and where each is explained."""


def holdout_section(doc: Mapping[str, Any]) -> str:
    """The held-out caveat, shown before the headline numbers it qualifies, or ""."""
    caveat = doc.get("holdout_caveat")
    if not caveat:
        return ""
    return ('<section><h2>Held-out records</h2>'
            f'<div class="banner nondp">HELD-OUT NOT VERIFIED<small>{escape(str(caveat))}'
            "</small></div></section>")


def selection_section(doc: Mapping[str, Any]) -> str:
    """The selection caveat of a report on private data, or ""."""
    caveat = doc.get("selection_caveat")
    if not caveat:
        return ""
    return ('<section><h2>Choosing a corpus by this report</h2>'
            f'<div class="banner nondp">NON-DP SELECTION<small>{escape(str(caveat))}</small>'
            "</div></section>")


def audit_block(doc: Mapping[str, Any]) -> str:
    """The empirical privacy audit beside the corpus's ε: the latest audit of the finetune
    that produced the corpus's model (or of another of its recipe family) when the job was
    claimed, or "not audited"; "" when the model is not a finetune's (no DP claim to test).

    An audit measures a lower bound on the ε the code really spends; it is evidence about
    the implementation, never a guarantee in place of the accounted ε above it."""
    audit: Mapping[str, Any] | None = doc.get("audit")
    if not audit:
        return ""
    head = "<h3>Empirical privacy audit (of the finetune that produced the model)</h3>"
    family = escape(str(audit.get("recipe_family") or "-"))
    if audit.get("status") != "audited":
        return (f'{head}<p class="note">Not audited: no audit of this model\'s finetune or of '
                f"its recipe family (<span class=\"mono\">{family}</span>) had succeeded when "
                "this report was made.</p>")
    verdict = str(audit.get("verdict") or "?")
    whose = ("this finetune" if audit.get("same_job")
             else f"finetune {audit.get('audited_job_id')} of the same recipe family")
    cards = [("verdict", verdict), ("mode", audit.get("mode")),
             ("measured ε ≥ (lower bound)", audit.get("epsilon_lower_bound")),
             ("claimed ε", audit.get("claimed_epsilon")),
             ("largest certifiable ε", audit.get("max_certifiable_epsilon")),
             ("engine", audit.get("engine")), ("device", audit.get("device")),
             ("ranks", audit.get("world_size")),
             ("code version", audit.get("code_version")), ("date", audit.get("finished_at")),
             ("audit job", audit.get("audit_job_id"))]
    tone = "nondp" if verdict in ("rejected", "unconfirmed") else "public"
    return (f'{head}<div class="banner {tone}">{escape(AUDIT_VERDICT_WORDS.get(verdict, verdict))}'
            f"<small>audit of {escape(whose)} (recipe family {family}); a lower bound on the "
            "ε the code spends, not a guarantee in place of the accounted ε"
            + ("" if audit.get("key_matches") is not False else
               f"; it is not of this finetune's key (the finetune ran on "
               f"{escape(str(audit.get('finetune_device') or '?'))}"
               + (f" x {escape(str(audit.get('finetune_world_size')))} ranks"
                  if (audit.get("finetune_world_size") or 1) != 1 else "")
               + ", this code version): "
               "no audit of that key yet")
            + "</small></div>"
            '<div class="cards">' + "".join(
                f'<div class="card"><div class="k">{escape(k)}</div>'
                f'<div class="v">{"-" if v is None else _fmt(v)}</div></div>'
                for k, v in cards) + "</div>")
