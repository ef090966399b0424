"""``dpsynth datasets|models ...``, ``dpsynth budget`` and ``dpsynth download``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

from dpsynth_cli.common import (
    cli_errors,
    console,
    err_console,
    print_json,
    print_table,
    state_of,
)
from dpsynth_cli.views import budget_lines, model_privacy_lines

datasets = typer.Typer(help="Upload and inspect datasets; make-documents writes public "
                       "synthetic documents with layout masks (public pretraining data).",
                       no_args_is_help=True)
models = typer.Typer(help="Upload and inspect models.", no_args_is_help=True)


def _split(csv: str | None) -> list[str] | None:
    return [part.strip() for part in csv.split(",") if part.strip()] if csv else None


def _sizes(text: str | None) -> dict[str, int] | None:
    """``"a=3, b=4"`` -> ``{"a": 3, "b": 4}``."""
    if not text:
        return None
    sizes: dict[str, int] = {}
    for part in _split(text) or []:
        name, sep, value = part.rpartition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise typer.BadParameter(f"{part!r} is not NAME=COUNT", param_hint="--class-sizes")
        sizes[name.strip()] = int(value)
    return sizes


@datasets.command("upload")
@cli_errors
def upload_dataset(
    ctx: typer.Context, path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    name: Annotated[str, typer.Option(help="a display name")],
    visibility: Annotated[str, typer.Option(help="public | private (immutable)")],
    epsilon_limit: Annotated[float | None, typer.Option(help="private: the budget")] = None,
    delta: Annotated[float | None, typer.Option(help="private: default min(1e-6, 1/(10N))")]
    = None,
    label_domain: Annotated[str | None, typer.Option(help="class names, comma separated")]
    = None,
    declared_size: Annotated[int | None, typer.Option(
        help="private: the public size N̂, an upper bound on the number of records (or "
        "subjects) shown to every reader and setting every job's sample rate; give this or "
        "--size-epsilon (the true count is never published)")] = None,
    size_epsilon: Annotated[float | None, typer.Option(
        help="private, instead of --declared-size: N̂ is a DP count of the records, "
        "charged to the budget at this epsilon (N̂ ≥ the true count but for a 1e-9 chance; "
        "delta then defaults to 1e-6)")] = None,
    partitions_disjoint: Annotated[bool | None, typer.Option(
        "--partitions-disjoint/--partitions-overlap", show_default=False,
        help="private: every record (subject) is in one class, so per-label jobs compose in "
        "parallel; checked at upload (default: disjoint for images, overlapping for "
        "subjects)")] = None,
    class_sizes: Annotated[str | None, typer.Option(
        help="private: public per-class sizes for per-label training, e.g. "
        "'cat=500,dog=400' (each ≥ the true count)")] = None,
    on_overlap: Annotated[str | None, typer.Option(
        help="private: 'link' charges the budget of your private dataset this upload shares "
        "records with (default: such an upload is refused)")] = None,
    on_duplicate: Annotated[str | None, typer.Option(
        help="copies of one image inside this upload: refuse (a private upload's default: "
        "a record counted k times is protected only at group size k) | deduplicate (keep "
        "the first copy); copies with another label or subject are refused either way")]
    = None,
    privacy_unit: Annotated[str | None, typer.Option(
        help="private: image (default) | subject (every image of one subject is one record: "
        "user-level DP, N̂ counts subjects)")] = None,
    subject_column: Annotated[str | None, typer.Option(
        help="subject unit: the npz array / Parquet column of subject ids (default "
        "'subjects'); an image folder carries subjects.csv (path,subject) instead")] = None,
    holdout_fraction: Annotated[float | None, typer.Option(
        help="set about this share of the records aside, each by a keyed hash of itself: "
        "never trained on, excluded from N̂, the real test data of `dpsynth evaluate`")]
    = None,
    holdout_key: Annotated[str | None, typer.Option(
        envvar="DPSYNTH_HOLDOUT_KEY", show_default=False,
        help="write-only key of the held-out hash (≥ 16 characters; never stored or "
        "shown): the same key holds out the same records in every version of a dataset "
        "(default: one drawn by the api). Prefer the DPSYNTH_HOLDOUT_KEY variable to the "
        "command line")] = None,
) -> None:
    """Upload a zip/tar image folder, .npz or Parquet file."""
    if visibility not in {"public", "private"}:
        raise typer.BadParameter("must be public or private", param_hint="--visibility")
    if on_overlap not in {None, "refuse", "link"}:
        raise typer.BadParameter("must be refuse or link", param_hint="--on-overlap")
    if on_duplicate not in {None, "refuse", "deduplicate"}:
        raise typer.BadParameter("must be refuse or deduplicate", param_hint="--on-duplicate")
    if privacy_unit not in {None, "image", "subject"}:
        raise typer.BadParameter("must be image or subject", param_hint="--privacy-unit")
    if holdout_fraction is not None and not 0 < holdout_fraction < 1:
        raise typer.BadParameter("must be in (0, 1)", param_hint="--holdout-fraction")
    if holdout_key is not None and holdout_fraction is None:
        raise typer.BadParameter("needs --holdout-fraction", param_hint="--holdout-key")
    if visibility == "private" and declared_size is None and size_epsilon is None:
        raise typer.BadParameter(
            "a private dataset states the size it makes public: --declared-size N (an upper "
            "bound on its records, or subjects, shown to every reader) or --size-epsilon E "
            "(a DP count of them, charged to its budget)", param_hint="--declared-size")
    result = state_of(ctx).client().upload_dataset(
        path, name=name, visibility=visibility, epsilon_limit=epsilon_limit, delta=delta,
        label_domain=_split(label_domain), declared_size=declared_size,
        size_epsilon=size_epsilon, partitions_disjoint=partitions_disjoint,
        class_sizes=_sizes(class_sizes), on_overlap=on_overlap, privacy_unit=privacy_unit,
        subject_column=subject_column, holdout_fraction=holdout_fraction,
        holdout_key=holdout_key, on_duplicate=on_duplicate)
    print_json(result)


@datasets.command("make-documents")
def make_documents(
    out: Annotated[Path, typer.Argument(dir_okay=False, help="the .npz file to write")],
    per_class: Annotated[int, typer.Option(min=1, help="pages per class")] = 100,
    size: Annotated[int, typer.Option(min=16, max=256, help="square side in pixels")] = 64,
    seed: Annotated[int, typer.Option(min=0, help="generator seed")] = 0,
    classes: Annotated[str | None, typer.Option(help="a subset of the classes, comma "
                                                "separated (default: all)")] = None,
) -> None:
    """Write PUBLIC synthetic document images with their layout masks (no api call).

    Every page comes from a seeded generator, not from anyone's data: public data.

    Suitable for public pretraining (layout_conditioning) and as a layout_source.

    Classes: letter, form, invoice, memo, email, resume, report, table, news, presentation.

    Upload it with: dpsynth datasets upload OUT --name documents --visibility public
    """
    from dpsynth_shared.documents import CLASS_NAMES, write_npz

    try:
        path = write_npz(out, per_class, size=size, seed=seed, classes=_split(classes))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--classes") from None
    names = _split(classes) or list(CLASS_NAMES)
    console.print(f"wrote {path}: {per_class * len(names)} public synthetic documents "
                  f"({len(names)} classes x {per_class}, {size}x{size} grayscale, with "
                  f"layout masks), seed {seed}", highlight=False, soft_wrap=True)


@datasets.command("list")
@cli_errors
def list_datasets(ctx: typer.Context) -> None:
    """Your datasets."""
    print_table(state_of(ctx).client().list_datasets(),
                ["dataset_id", "name", "visibility", "declared_size", "created_at"], "datasets")


@datasets.command("show")
@cli_errors
def show_dataset(ctx: typer.Context, dataset_id: str) -> None:
    """One dataset as JSON."""
    print_json(state_of(ctx).client().get_dataset(dataset_id))


@datasets.command("release-class-sizes")
@cli_errors
def release_class_sizes(
    ctx: typer.Context, dataset_id: str,
    epsilon: Annotated[float, typer.Option("--epsilon", help="the release's epsilon, charged "
                                           "to the dataset's budget")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show sigma and the budget "
                                          "impact; charge nothing")] = False,
) -> None:
    """Release the class sizes (per-label training) through a charged DP histogram."""
    print_json(state_of(ctx).client().release_class_sizes(dataset_id, epsilon=epsilon,
                                                          dry_run=dry_run))


@datasets.command("derive")
@cli_errors
def derive_dataset(
    ctx: typer.Context, dataset_id: str,
    name: Annotated[str, typer.Option(help="the derived dataset's display name")],
    classes: Annotated[str | None, typer.Option(
        help="a class subset: the class names kept, comma separated")] = None,
    split: Annotated[float | None, typer.Option(
        help="a keyed-hash split: the train part's expected share of the records, in "
        "(0, 1)")] = None,
    part: Annotated[str, typer.Option(help="split: train | holdout")] = "train",
    declared_size: Annotated[int | None, typer.Option(
        help="the child's public size N̂ (≥ its true count; default: a bound from the "
        "parent's public sizes, the parent's N̂ for a split; a smaller one needs the owner "
        "scope)")] = None,
) -> None:
    """Derive a class subset or a train/holdout split (a selection, no copy; a private one
    charges its parent's budget, sampled at q = batch / N̂ of the child)."""
    if (classes is None) == (split is None):
        raise typer.BadParameter("give either --classes (a subset) or --split (a split)")
    if split is not None and part not in {"train", "holdout"}:
        raise typer.BadParameter("must be train or holdout", param_hint="--part")
    client = state_of(ctx).client()
    if classes is not None:
        result = client.derive_dataset(dataset_id, name=name, kind="subset",
                                       classes=_split(classes), declared_size=declared_size)
    else:
        result = client.derive_dataset(dataset_id, name=name, kind="split", fraction=split,
                                       part=part, declared_size=declared_size)
    print_json(result)


@datasets.command("holdout")
@cli_errors
def list_held_out(ctx: typer.Context, dataset_id: str) -> None:
    """The upload's held-out records (owner scope) as JSON: each record's position in the
    upload and its sha256 content hash, to reproduce an evaluation outside the platform."""
    print_json({"items": state_of(ctx).client().list_held_out(dataset_id)})


@datasets.command("delete")
@cli_errors
def delete_dataset(
    ctx: typer.Context, dataset_id: str,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete a dataset's data (owner scope). Its budget, ledger entries and record hashes
    remain: a re-upload of its records is still refused, or linked to the same budget."""
    if not yes:
        typer.confirm(f"Delete the data of dataset {dataset_id}?", abort=True)
    print_json(state_of(ctx).client().delete_dataset(dataset_id))


@datasets.command("set-limit")
@cli_errors
def set_limit(
    ctx: typer.Context, dataset_id: str,
    epsilon_limit: Annotated[float | None, typer.Option(
        help="the new, LOWER limit (a limit is never raised; below what is spent it only "
        "blocks new work)")] = None,
    warning_fraction: Annotated[float | None, typer.Option(
        help="warn when spent reaches this fraction of the limit (default 0.8)")] = None,
) -> None:
    """Lower a private dataset's epsilon limit and/or set its warning fraction."""
    if epsilon_limit is None and warning_fraction is None:
        raise typer.BadParameter("give --epsilon-limit and/or --warning-fraction")
    body = state_of(ctx).client().update_budget(dataset_id, epsilon_limit=epsilon_limit,
                                                warning_fraction=warning_fraction)
    for label, value in budget_lines(body):
        console.print(f"{label}: {value}", style="bold yellow" if label == "warning" else "",
                      highlight=False, soft_wrap=True)


@cli_errors
def budget(ctx: typer.Context, dataset_id: str) -> None:
    """A private dataset's privacy budget: limit, spent, tight figure, reserved, remaining."""
    body = state_of(ctx).client().get_budget(dataset_id)
    width = max(len(label) for label, _ in budget_lines(body))
    for label, value in budget_lines(body):
        style = "bold yellow" if label == "warning" else ""
        console.print(f"{label:<{width}}  {value}", style=style, highlight=False,
                      soft_wrap=True)


@models.command("list")
@cli_errors
def list_models(ctx: typer.Context) -> None:
    """Your models."""
    print_table(state_of(ctx).client().list_models(),
                ["model_id", "name", "source", "created_at"], "models")


@models.command("upload")
@cli_errors
def upload_model(ctx: typer.Context, path: Annotated[Path, typer.Argument(exists=True)],
                 name: Annotated[str, typer.Option(help="a display name")]) -> None:
    """Upload a diffusers save_pretrained folder (safetensors only) or its .tar."""
    print_json(state_of(ctx).client().upload_model(path, name=name))


@models.command("show")
@cli_errors
def show_model(ctx: typer.Context, model_id: str) -> None:
    """One model as JSON; a DP model's privacy figures, each labelled, follow on stderr."""
    body = state_of(ctx).client().get_model(model_id)
    print_json(body)
    for label, value in model_privacy_lines(body):
        err_console.print(f"{label}: {value}", highlight=False, markup=False, soft_wrap=True)


@models.command("download")
@cli_errors
def download_model(ctx: typer.Context, model_id: str,
                   output: Annotated[Path | None, typer.Option(
                       "-o", "--output", help="default: MODEL_ID.zip")] = None) -> None:
    """Download a model as the zip of its diffusers folder (re-uploadable as is)."""
    client = state_of(ctx).client()
    path = _with_progress(model_id, lambda on_chunk: client.download_model(
        model_id, output or Path(f"{model_id}.zip"), on_chunk=on_chunk))
    console.print(f"saved {path} ({path.stat().st_size} bytes)", highlight=False)


def _with_progress(label: str,
                   fetch: Callable[[Callable[[int, int | None], None]], Path]) -> Path:
    """Run a streamed download under a progress bar (total unknown until a length comes)."""
    with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
                  console=console) as progress:
        task = progress.add_task(label, total=None)

        def on_chunk(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        return fetch(on_chunk)


@cli_errors
def download(ctx: typer.Context, artifact_id: str,
             output: Annotated[Path | None, typer.Option("-o", "--output")] = None) -> None:
    """Download an artifact (streamed, with a progress bar)."""
    client = state_of(ctx).client()
    if output is None:
        meta = client.get_artifact(artifact_id)
        name = meta.get("filename") or Path(str(meta.get("key") or artifact_id)).name
        output = Path(name)
    target = output
    path = _with_progress(artifact_id, lambda on_chunk: client.download_artifact(
        artifact_id, target, on_chunk=on_chunk))
    console.print(f"saved {path} ({path.stat().st_size} bytes)", highlight=False)
