"""``dpsynth features train``, ``dpsynth evaluate`` and ``dpsynth report`` (issue 5).

``features train`` submits a ``feature_net`` job: a small classifier trained WITHOUT privacy on
a PUBLIC dataset, whose feature space the evaluations measure distances in. ``evaluate``
submits an ``evaluate`` job comparing a synthetic corpus with a reference dataset's training
and held-out records. ``report`` prints an evaluate job's headline numbers, each beside what
it must be read against, and saves the HTML page and/or the JSON document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from dpsynth_client import Client
from rich.table import Table

from dpsynth_cli.common import cli_errors, console, print_json, state_of
from dpsynth_cli.follow import watch_job
from dpsynth_cli.options import CliTyper, Output, PollOption, output_mode, print_id
from dpsynth_cli.summaries import audit_summary_line, submitted_line
from dpsynth_cli.views import report_footer, report_header, report_rows

CLASSIFIERS = ("cnn", "logreg", "mlp")

features = CliTyper(help="Feature networks: trained on PUBLIC data, without privacy, for "
                    "the feature-space metrics of evaluate jobs.")


def _split(csv: str | None) -> list[str] | None:
    return [part.strip() for part in csv.split(",") if part.strip()] if csv else None


def feature_net_spec(dataset_id: str, *, image_size: int | None = None,
                     channels: int | None = None, epochs: int | None = None,
                     seed: int | None = None) -> dict[str, Any]:
    """A ``feature_net`` job spec; options left ``None`` take the api's defaults."""
    spec: dict[str, Any] = {"type": "feature_net", "dataset_id": dataset_id,
                            "image_size": image_size, "channels": channels, "epochs": epochs,
                            "seed": seed}
    return {k: v for k, v in spec.items() if v is not None}


def evaluate_spec(corpus_artifact_id: str, *, dataset_id: str,
                  feature_model_id: str | None = None, classifiers: list[str] | None = None,
                  inception: bool = False, include_private_images: bool = True,
                  dp_epsilon: float | None = None) -> dict[str, Any]:
    """An ``evaluate`` job spec (defaults omitted, so the api's apply).

    Raises:
        typer.BadParameter: for an unknown or repeated classifier.
    """
    spec: dict[str, Any] = {"type": "evaluate", "corpus_artifact_id": corpus_artifact_id,
                            "dataset_id": dataset_id}
    if feature_model_id:
        spec["feature_model_id"] = feature_model_id
    if classifiers is not None:
        unknown = [c for c in classifiers if c not in CLASSIFIERS]
        if unknown or not classifiers or len(set(classifiers)) != len(classifiers):
            raise typer.BadParameter(f"give distinct names among {', '.join(CLASSIFIERS)}",
                                     param_hint="--classifiers")
        spec["classifiers"] = classifiers
    if inception:
        spec["inception"] = True
    if not include_private_images:
        spec["include_private_images"] = False
    if dp_epsilon is not None:
        spec["dp"] = {"target_epsilon": dp_epsilon}
    return spec


def dp_release_lines(released: Any) -> list[str]:
    """An evaluate job's DP release (``result.dp_evaluation``) as lines: its label and
    epsilon, then each released metric."""
    if not isinstance(released, dict):
        return [str(released)]
    lines = [f"{key}: {released[key]}" for key in ("label", "epsilon", "delta")
             if released.get(key) is not None]
    metrics = released.get("metrics") or {}
    lines.extend(f"{name}: {value}" for name, value in metrics.items())
    return lines


def print_report(report: dict[str, Any]) -> None:
    """The header lines (NON-DP in bold red when it applies) and the headline table."""
    for line in report_header(report):
        style = "bold red" if line.startswith(("NON-DP", "HELD-OUT NOT VERIFIED")) else ""
        console.print(line, style=style, highlight=False, soft_wrap=True)
    audit = audit_summary_line(report.get("audit"), this="the model's finetune")
    if audit:  # as of the evaluation (the model's view has the latest)
        console.print(f"privacy audit of the model's finetune, when evaluated: {audit}",
                      highlight=False, soft_wrap=True)
    table = Table(title="evaluation headline")
    for column in ("metric", "value", "compare with"):
        table.add_column(column, overflow="fold")
    for metric, value, compare in report_rows(report):
        table.add_row(metric, value, compare)
    console.print(table)
    for line in report_footer(report):
        console.print(line, highlight=False, soft_wrap=True)


def _submit_and_maybe_wait(client: Client, spec: dict[str, Any], *, wait: bool,
                           poll: float, mode: Output) -> tuple[dict[str, Any], int]:
    """Submit ``spec``; print its id (quiet), body (json) or one line, then with ``wait``
    follow it (bar on stderr) and report its end in the same mode."""
    job = client.submit_job(spec)
    if mode is Output.JSON and not wait:
        print_json(job)
    elif mode is Output.QUIET and not wait:
        print_id(job["job_id"])
    elif mode is Output.HUMAN:
        console.print(submitted_line(job), highlight=False, soft_wrap=True)
    if not wait:
        return job, 0
    return job, watch_job(client, str(job["job_id"]), poll=poll, mode=mode)


@features.command("train")
@cli_errors
def train(
    ctx: typer.Context,
    dataset_id: Annotated[str, typer.Argument(help="a PUBLIC dataset (ds_...)",
                                              show_default=False)],
    image_size: Annotated[int | None, typer.Option(help="images are resized to this (a "
                                                   "multiple of 4; default 32)")] = None,
    channels: Annotated[int | None, typer.Option(help="1 or 3 (default 1)")] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="training epochs (default 10)")]
    = None,
    seed: Annotated[int | None, typer.Option(help="training seed (default 0)")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="follow the job with a progress bar (on stderr) to its end; exit 1 "
        "unless it succeeded")] = False,
    poll: PollOption = 2.0,
    json_: Annotated[bool, typer.Option(
        "--json", help="print the api's JSON body (with --wait: the finished job's)")]
    = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the job id (with --wait: the feature network's "
        "model id)")] = False,
) -> None:
    """Train a feature network on a PUBLIC dataset (a feature_net job; no privacy, no
    budget). Its accuracy is measured on the dataset's held-out records (or a seeded
    validation share) and recorded with the sha256 of its weights."""
    if channels not in (None, 1, 3):
        raise typer.BadParameter("must be 1 or 3", param_hint="--channels")
    mode = output_mode(json_, quiet)
    spec = feature_net_spec(dataset_id, image_size=image_size, channels=channels,
                            epochs=epochs, seed=seed)
    _, code = _submit_and_maybe_wait(state_of(ctx).client(), spec, wait=wait, poll=poll,
                                     mode=mode)
    raise typer.Exit(code)


@cli_errors
def evaluate(
    ctx: typer.Context,
    corpus_artifact_id: Annotated[str, typer.Argument(
        help="a generate job's corpus artifact (art_...)", show_default=False)],
    dataset: Annotated[str, typer.Option("--dataset", help="the reference dataset (uploaded "
                                         "with --holdout-fraction)")],
    feature_model: Annotated[str | None, typer.Option(
        "--feature-model", help="a feature network (`dpsynth features train`): enables "
        "fd_dpsynth, precision/recall, density/coverage")] = None,
    classifiers: Annotated[str | None, typer.Option(
        help="comma separated among cnn, logreg, mlp (default cnn,logreg)")] = None,
    inception: Annotated[bool, typer.Option(
        "--inception", help="also Inception FID (weights configured on the worker)")] = False,
    no_private_images: Annotated[bool, typer.Option(
        "--no-private-images", help="private reference: show no real image in the report")]
    = False,
    dp_epsilon: Annotated[float | None, typer.Option(
        "--dp-epsilon", min=0.0, help="private reference: also release the classifiers' "
        "accuracies on the held-out records with DP at this epsilon, charged to the "
        "held-out partition (selection by them stays inside the guarantee)")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="follow the job with a progress bar (on stderr), then print its "
        "headline numbers; exit 1 unless it succeeded")] = False,
    poll: PollOption = 2.0,
    json_: Annotated[bool, typer.Option(
        "--json", help="print the api's JSON body (with --wait: the finished job's)")]
    = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the evaluate job's id (the key of `dpsynth "
        "report`), also with --wait")] = False,
) -> None:
    """Evaluate a synthetic corpus against a reference dataset (an evaluate job).

    On a PRIVATE reference this is a non-DP read of private data: it needs the owner scope,
    charges no epsilon but is recorded in the ledger, and its report is owner-only. If you
    choose what to release by looking at it, the released epsilon does not cover that
    choice; --dp-epsilon releases the accuracies with DP instead (docs/privacy.md).
    """
    mode = output_mode(json_, quiet)
    spec = evaluate_spec(corpus_artifact_id, dataset_id=dataset, feature_model_id=feature_model,
                         classifiers=_split(classifiers), inception=inception,
                         include_private_images=not no_private_images, dp_epsilon=dp_epsilon)
    client = state_of(ctx).client()
    job, code = _submit_and_maybe_wait(client, spec, wait=wait, poll=poll, mode=mode)
    if wait and code == 0 and mode is Output.HUMAN:
        print_report(client.get_report(str(job["job_id"])))
        if dp_epsilon is not None:
            released = (client.get_job(str(job["job_id"])).get("result") or {}).get(
                "dp_evaluation")
            console.print("DP evaluation (inside the guarantee):", style="bold")
            for line in dp_release_lines(released):
                console.print(f"  {line}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@cli_errors
def report(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="an evaluate job (job_...)",
                                          show_default=False)],
    html: Annotated[Path | None, typer.Option("--html", dir_okay=False,
                                              help="save the HTML report here")] = None,
    json_: Annotated[Path | None, typer.Option("--json", dir_okay=False,
                                               help="save the JSON report here")] = None,
) -> None:
    """Print an evaluate job's headline numbers; --html / --json save the report files."""
    client = state_of(ctx).client()
    print_report(client.get_report(job_id))
    for fmt, path in (("html", html), ("json", json_)):
        if path is not None:
            saved = client.download_report(job_id, path, format=fmt)
            console.print(f"saved {saved} ({saved.stat().st_size} bytes)", highlight=False)
