"""Pure renderers of the one-line summaries and next steps the CLI prints by default
(issue 15, item 2): what was made, the id to keep, and the command that comes next.

Each function takes an api body (the same dict ``--json`` prints) and returns text; nothing
here talks to the api or a terminal, so the unit tests call them directly.
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.audit_specs import AUDIT_VERDICT_WORDS
from dpsynth_shared.errors import round_down

from dpsynth_cli.views import number as _num

MODEL_JOBS = frozenset({"pretrain", "finetune", "feature_net"})
EPSILONS_DOC = "docs/epsilons.md"


def _count(value: Any) -> str:
    """``1100`` → ``"1,100"`` (a non-number as it is)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def _eps(value: Any) -> str:
    """An epsilon as a person reads it: ``8`` → ``"8"``, ``5.1234`` → ``"5.12"``."""
    if value is None:
        return "-"
    try:
        return f"{float(value):.3g}" if float(value) < 100 else f"{float(value):.1f}"
    except (TypeError, ValueError):
        return str(value)


def job_name(job: dict[str, Any]) -> str | None:
    """The job's name in the user's words: the api's ``name``, else the spec's."""
    name = job.get("name") or (job.get("spec") or {}).get("name")
    return str(name) if name else None


def dataset_line(body: dict[str, Any]) -> str:
    """``dataset ds_… "name" (private): 808 images to train on, 10 classes; budget: epsilon
    limit 8, declared size 1,100, held-out fraction 0.25 (270 images)``: the sizes the
    caller may see (the true count and held-out size only with the owner scope)."""
    unit = "subjects" if body.get("privacy_unit") == "subject" else "images"
    parts = [f"dataset {body.get('dataset_id', '-')} \"{body.get('name', '')}\" "
             f"({body.get('visibility', '?')})"]
    size = body.get("true_size")
    if size is None and body.get("visibility") == "public":
        size = body.get("declared_size")  # a public dataset's size is its true count
    facts = []
    if size is not None:  # held-out records are not counted in it
        facts.append(f"{_count(size)} {unit}"
                     + (" to train on" if body.get("holdout_fraction") is not None else ""))
    if body.get("num_classes") is not None:
        facts.append(f"{_count(body['num_classes'])} classes")
    line = parts[0] + (": " + ", ".join(facts) if facts else "")
    budget = []
    if body.get("epsilon_limit") is not None:
        budget.append(f"epsilon limit {_eps(body['epsilon_limit'])}")
    if body.get("visibility") == "private" and body.get("declared_size") is not None:
        budget.append(f"declared size {_count(body['declared_size'])}")
    if body.get("holdout_fraction") is not None:
        held = (f" ({_count(body['holdout_size'])} {unit})"
                if body.get("holdout_size") is not None else "")
        budget.append(f"held-out fraction {body['holdout_fraction']:g}{held}")
    if budget:  # a public dataset has no budget: only its held-out part
        line += ("; budget: " if body.get("visibility") == "private" else "; ")
        line += ", ".join(budget)
    shared = body.get("budget_id")
    if shared and shared != body.get("dataset_id"):
        line += f"; charges the budget of {shared}"
    return line


def model_line(body: dict[str, Any]) -> str:
    """``model mdl_… "name": DP (job epsilon 4, spent when trained 5.1)`` or ``not DP``."""
    line = f"model {body.get('model_id', '-')} \"{body.get('name', '')}\""
    origin = body.get("produced_by_job_id")
    line += f" from job {origin}" if origin else f" ({body.get('source', 'upload')})"
    if body.get("dp"):
        return (line + f": DP (job epsilon {_eps(body.get('job_epsilon'))}, dataset spent "
                f"when trained {_eps(body.get('dataset_epsilon_spent'))})")
    return line + ": not DP"


def submitted_line(job: dict[str, Any]) -> str:
    """``job job_… submitted: finetune "digits-dp-finetune", queued``."""
    name = job_name(job)
    return (f"job {job.get('job_id', '-')} submitted: {job.get('type', '?')}"
            + (f" \"{name}\"" if name else "") + f", {job.get('state', '?')}")


def corpus_artifact_id(job: dict[str, Any]) -> str | None:
    """The id of a generate job's corpus (its artifact of kind ``corpus``)."""
    for ref in job.get("artifacts") or []:
        if isinstance(ref, dict) and ref.get("kind") == "corpus":
            return str(ref["artifact_id"])
    return None


def produced_id(job: dict[str, Any]) -> str | None:
    """The id a finished job PRODUCED (what ``--watch --quiet`` prints): the model of a
    pretrain / finetune / feature_net job (``result.model_id``, never the base model), a
    generate job's corpus artifact, an evaluate job's own id (its report's key); None
    until the job succeeded or when the api does not list it."""
    if job.get("state") != "succeeded":
        return None
    kind = job.get("type")
    if kind in MODEL_JOBS:
        model = (job.get("result") or {}).get("model_id")
        return str(model) if model else None
    if kind == "generate":
        return corpus_artifact_id(job)
    return str(job.get("job_id")) if job.get("job_id") else None


def next_steps(job: dict[str, Any]) -> list[str]:
    """The lines ending a succeeded job: what it produced and the natural next command."""
    made, kind = produced_id(job), job.get("type")
    if made is None:
        return []
    if kind == "generate":
        return [f"corpus: {made}",
                f"download it: dpsynth download {made} -o corpus.zip"]
    if kind == "pretrain":
        return [f"produced model: {made} (trained on public data: a base model)",
                "next: dpsynth jobs submit examples/quickstart/finetune.yaml "
                f"--set base_model_id={made} --set dataset_id=ds_... --dry-run"]
    if kind == "finetune":
        return [f"produced model: {made} (fine-tuned from {job.get('model_id') or '-'})",
                "next: dpsynth jobs submit examples/quickstart/generate.yaml "
                f"--set model_id={made} --watch"]
    if kind == "feature_net":
        return [f"produced feature network: {made}",
                f"next: dpsynth evaluate art_... --dataset ds_... --feature-model {made} --wait"]
    if kind == "evaluate":
        return [f"report: dpsynth report {made} --html report.html"]
    if kind == "audit":
        return [f"audit: {audit_line(job)}", f"details: dpsynth jobs show {made}"]
    return []


AUDIT_VERDICTS = AUDIT_VERDICT_WORDS
"""An audit's verdict in words (the evaluation report's HTML says the same)."""


def audit_line(job: dict[str, Any]) -> str:
    """An audit job's verdict in words, with its measured bound, the claim and the most
    these canaries could certify."""
    view = (job.get("result") or {}).get("audit_result") or {}
    if not view:
        return "no result yet"
    verdict = str(view.get("verdict", "?"))
    return (f"{AUDIT_VERDICTS.get(verdict, verdict)}; measured epsilon >= "
            f"{_eps(view.get('epsilon_lower_bound'))} (f-DP: >= "
            f"{_eps((view.get('gdp') or {}).get('epsilon_lower_bound'))}) against a claimed "
            f"{_eps(view.get('claimed_epsilon'))}; at most "
            f"{_eps(view.get('max_certifiable_epsilon'))} could be certified "
            f"({view.get('canaries')} canaries, {view.get('confidence')} confidence)")


def audit_summary_line(audit: dict[str, Any] | None, *, this: str,
                       job_id: str | None = None) -> str | None:
    """The "privacy audit" line of a finetune's view, a DP model's view (its producing
    finetune's) or an evaluation report: the latest matching audit's verdict, bound, claim,
    engine, device, version and date, or "not audited"; None when there is none to show.
    ``this`` names the finetune the view is about (``job_id``, when known, goes into the
    command that would audit it)."""
    audit = audit or {}
    if audit.get("status") == "not_audited":
        return (f"not audited ({audit.get('recipe_family')}): dpsynth jobs submit "
                f"examples/audit.yaml --set job_id={job_id or '...'}")
    if audit.get("status") != "audited":
        return None
    whose = this if audit.get("same_job") else f"job {audit.get('audited_job_id')}"
    return (f"{audit.get('verdict')}: measured epsilon >= "
            f"{_eps(audit.get('epsilon_lower_bound'))} against a claimed "
            f"{_eps(audit.get('claimed_epsilon'))} (audit {audit.get('audit_job_id')}"
            f" of {whose}, {audit.get('engine')}, "
            f"{_where(audit.get('device'), audit.get('world_size'))}, version "
            f"{audit.get('code_version')}, {audit.get('finished_at')})"
            + ("" if audit.get("key_matches") is not False else
               " [not this finetune's key: it ran on "
               f"{_where(audit.get('finetune_device') or '?', audit.get('finetune_world_size'))},"
               " this code version; no audit of that key yet]"))


def _where(device: Any, ranks: Any) -> str:
    """``cuda`` or ``cuda x 2 ranks`` (one rank, or not recorded: the device alone)."""
    return f"{device} x {ranks} ranks" if isinstance(ranks, int) and ranks > 1 else str(device)


def job_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of ``dpsynth jobs show``: the base model (what a finetune starts
    from, or what a generate job samples) is named apart from the produced model, which is
    shown only once the job succeeded, so the one is never taken for the other."""
    name = job_name(job)
    rows = [("job", str(job.get("job_id", "-"))),
            ("type", str(job.get("type", "?")) + (f"  \"{name}\"" if name else "")),
            ("state", _state_text(job))]
    if job.get("dataset_id"):
        rows.append(("dataset", str(job["dataset_id"])))
    kind, base = job.get("type"), job.get("model_id")
    if base and kind == "finetune":
        rows.append(("base model", f"{base}  (the model fine-tuned; not this job's result)"))
    elif base:
        rows.append(("model", f"{base}  (sampled)" if kind == "generate" else str(base)))
    if kind in MODEL_JOBS:
        made = produced_id(job)
        rows.append(("produced model", made or "(none yet: shown once the job succeeds)"))
    elif kind == "generate":
        rows.append(("corpus", produced_id(job) or "(none yet: shown once the job succeeds)"))
    elif kind == "audit":
        audited = ((job.get("result") or {}).get("audit") or {}).get("audited_job_id")
        rows.append(("audited job", str(audited or "-")))
        rows.append(("audit", audit_line(job)))
    privacy = job.get("privacy") or {}
    if privacy.get("job_epsilon") is not None:
        rows.append(("job epsilon", _eps(privacy["job_epsilon"])))
    audit = audit_summary_line(job.get("audit"), this="this job", job_id=job.get("job_id"))
    if audit:
        rows.append(("privacy audit", audit))
    if privacy.get("dataset_epsilon_spent_after") is not None:
        rows.append(("dataset spent after (RDP filter)",
                     _eps(privacy["dataset_epsilon_spent_after"])))
    error = job.get("error")
    if error:
        rows.append(("error", f"{error.get('code')}: {error.get('message') or ''}".strip()))
    for label, key in (("created", "created_at"), ("finished", "finished_at")):
        if job.get(key):
            rows.append((label, str(job[key])))
    return rows


def _state_text(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    total = p.get("total") or 0
    text = str(job.get("state", "?"))
    if total and job.get("state") not in {"succeeded", "queued"}:
        text += f"  (step {p.get('step', 0)}/{total})"
    return text


def dry_run_line(result: dict[str, Any], budget: dict[str, Any] | None) -> str:
    """The dry run's first line: ``this job spends X of Y; Z left``, with what X, Y, Z are.

    X is how far the job moves the dataset's spent figure (the RDP filter's epsilon, the
    guarantee): the plan's figure after the job minus the figure already held (spent plus
    what running jobs reserve); Y the dataset's epsilon limit; Z the limit minus the figure
    after. A job's own epsilon (its target) is smaller than X: the filter's conversion to
    (epsilon, delta) is looser than the job's own accounting (docs/epsilons.md).
    """
    plan = result.get("plan") or {}
    kind = result.get("type") or (result.get("spec") or {}).get("type")
    after = plan.get("dataset_epsilon_spent_after")
    if after is None:
        dp = plan.get("dp") if isinstance(plan.get("dp"), dict) else None
        if dp and dp.get("dataset_epsilon_spent_after") is not None:
            plan, after = dp, dp.get("dataset_epsilon_spent_after")
        elif kind == "generate":
            return ("this job spends no privacy budget: sampling a DP model is "
                    "post-processing")
        elif kind == "audit":
            return ("this job spends no privacy budget: an audit runs the audited job's "
                    "DP-SGD on a public stand-in and reads no private record")
        elif kind == "evaluate":
            return ("this job spends no epsilon: "
                    + ("a non-DP read of private data, recorded in the ledger"
                       if plan.get("non_dp_read") else "its reference is public"))
        else:
            return "this job spends no privacy budget: its dataset is public"
    limit = (budget or {}).get("epsilon_limit")
    before = float(plan.get("dataset_epsilon_spent_before") or 0.0)
    reserved = float((budget or {}).get("dataset_epsilon_reserved") or 0.0)
    spends = max(0.0, float(after) - before - reserved)
    held = f" + {_eps(reserved)} reserved by running jobs" if reserved else ""
    release = plan.get("central_images") or {}
    own = (f"the DP-SGD part's own epsilon is {_eps(plan.get('job_epsilon'))}, its "
           f"central-image release's {_eps(release.get('epsilon'))}, both counted in the "
           "figure after" if release else
           f"the job's own epsilon is {_eps(plan.get('job_epsilon'))}")
    what = f"(the dataset's spent figure, RDP filter: {_eps(before)}{held} → {_eps(after)}; {own})"
    if limit is None:
        return f"this job spends {_eps(spends)} of the dataset's budget {what}"
    if plan.get("admissible") is False:
        best = plan.get("max_admissible_target_epsilon")
        left = max(0.0, float(limit) - before - reserved)
        return (f"this job would spend {_eps(spends)} of {_eps(limit)}, but only "
                f"{_eps(left)} is left: it would be refused"
                # rounded DOWN (as the ledger's refusal): following the advice is admitted
                + (f" (lower target_epsilon to ≤ {round_down(float(best)):g})"
                   if best is not None else "")
                + f" {what}")
    left = max(0.0, float(limit) - float(after))
    return f"this job spends {_eps(spends)} of {_eps(limit)}; {_eps(left)} left {what}"


def dry_run_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the plan a dry run returns: what would run and each epsilon
    named apart."""
    plan = result.get("plan") or {}
    rows = [("type", str(result.get("type", "?")))]
    for label, key in (("dataset", "dataset_id"), ("model", "model_id"), ("steps", "steps")):
        if result.get(key) is not None:
            rows.append((label, str(result[key])))
    figures = (("job epsilon (this job alone)", "job_epsilon", "e"),
               ("noise multiplier", "noise_multiplier", "f"),
               ("sample rate", "sample_rate", "f"),
               ("expected batch size", "expected_batch_size", "c"),
               ("delta", "delta", "d"),
               ("spent before (RDP filter)", "dataset_epsilon_spent_before", "e"),
               ("spent after (RDP filter)", "dataset_epsilon_spent_after", "e"),
               ("tight after (PLD)", "dataset_tight_epsilon_after", "e"),
               ("admissible", "admissible", "s"),
               ("max admissible target epsilon", "max_admissible_target_epsilon", "e"),
               ("composition", "composition", "s"),
               ("accountant", "accountant", "s"))
    for label, key, fmt in figures:
        value = plan.get(key)
        if value is None:
            continue
        text = {"e": _eps(value), "f": _num(value), "c": _count(value),
                "d": _num(value, ".3e")}.get(fmt, str(value))
        if key == "dataset_tight_epsilon_after" and plan.get("dataset_tight_epsilon_label"):
            text += f"  ({plan['dataset_tight_epsilon_label']})"
        rows.append((label, text))
    release = plan.get("central_images")
    if release:
        rows.append(("central-image release", f"standalone epsilon "
                     f"{_eps(release.get('epsilon'))}, charged when the job starts; counted "
                     "in 'spent after' and 'admissible'"))
    for name, part in sorted((plan.get("per_label") or {}).items()):
        rows.append((f"class {name}", f"job epsilon {_eps(part.get('job_epsilon'))}, noise "
                     f"{_num(part.get('noise_multiplier'))}, q {_num(part.get('sample_rate'))}, "
                     f"{part.get('steps', '?')} steps"))
    rows.extend(("note", str(note)) for note in plan.get("notes") or [])
    return rows
