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
from dpsynth_cli.jobs import watch_job
from dpsynth_cli.views import report_footer, report_header, report_rows

CLASSIFIERS = ("cnn", "logreg", "mlp")

features = typer.Typer(help="Feature networks: trained on PUBLIC data, without privacy, for "
                       "the feature-space metrics of evaluate jobs.", no_args_is_help=True)


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


def print_report(report: dict[str, Any]) -> None:
    """The header lines (NON-DP in bold red when it applies) and the headline table."""
    for line in report_header(report):
        style = "bold red" if line.startswith("NON-DP") else ""
        console.print(line, style=style, highlight=False, soft_wrap=True)
    table = Table(title="evaluation headline")
    for column in ("metric", "value", "compare with"):
        table.add_column(column, overflow="fold")
    for metric, value, compare in report_rows(report):
        table.add_row(metric, value, compare)
    console.print(table)
    for line in report_footer(report):
        console.print(line, highlight=False, soft_wrap=True)


def _submit_and_maybe_wait(client: Client, spec: dict[str, Any], wait: bool,
                           poll: float) -> tuple[dict[str, Any], int]:
    job = client.submit_job(spec)
    print_json(job)
    if not wait:
        return job, 0
    return job, watch_job(client, str(job["job_id"]), poll=poll)


@features.command("train")
@cli_errors
def train(
    ctx: typer.Context, dataset_id: Annotated[str, typer.Argument(help="a PUBLIC dataset")],
    image_size: Annotated[int | None, typer.Option(help="images are resized to this (a "
                                                   "multiple of 4; default 32)")] = None,
    channels: Annotated[int | None, typer.Option(help="1 or 3 (default 1)")] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="default 10")] = None,
    seed: Annotated[int | None, typer.Option(help="default 0")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job to its end")] = False,
    poll: Annotated[float, typer.Option(help="seconds between polls with --wait")] = 2.0,
) -> None:
    """Train a feature network on a PUBLIC dataset (a feature_net job; no privacy, no
    budget). Its accuracy is measured on the dataset's held-out records (or a seeded
    validation share) and recorded with the sha256 of its weights."""
    if channels not in (None, 1, 3):
        raise typer.BadParameter("must be 1 or 3", param_hint="--channels")
    spec = feature_net_spec(dataset_id, image_size=image_size, channels=channels,
                            epochs=epochs, seed=seed)
    _, code = _submit_and_maybe_wait(state_of(ctx).client(), spec, wait, poll)
    raise typer.Exit(code)


@cli_errors
def evaluate(
    ctx: typer.Context,
    corpus_artifact_id: Annotated[str, typer.Argument(help="a generate job's corpus artifact")],
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
    wait: Annotated[bool, typer.Option("--wait", help="follow the job, then print its "
                                       "headline numbers")] = False,
    poll: Annotated[float, typer.Option(help="seconds between polls with --wait")] = 2.0,
) -> None:
    """Evaluate a synthetic corpus against a reference dataset (an evaluate job).

    On a PRIVATE reference this is a non-DP read of private data: it needs the owner scope,
    charges no epsilon but is recorded in the ledger, and its report is owner-only. If you
    choose what to release by looking at it, the released epsilon does not cover that
    choice; ``--dp-epsilon`` releases the accuracies with DP instead (docs/privacy.md).
    """
    spec = evaluate_spec(corpus_artifact_id, dataset_id=dataset, feature_model_id=feature_model,
                         classifiers=_split(classifiers), inception=inception,
                         include_private_images=not no_private_images, dp_epsilon=dp_epsilon)
    client = state_of(ctx).client()
    job, code = _submit_and_maybe_wait(client, spec, wait, poll)
    if wait and code == 0:
        print_report(client.get_report(str(job["job_id"])))
        if dp_epsilon is not None:
            released = (client.get_job(str(job["job_id"])).get("result") or {}).get(
                "dp_evaluation")
            console.print("DP evaluation (inside the guarantee):", style="bold")
            print_json(released)
    raise typer.Exit(code)


@cli_errors
def report(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="an evaluate job")],
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
