"""``dpsynth datasets ...`` and ``dpsynth budget``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dpsynth_cli.common import (
    cli_errors,
    console,
    print_json,
    print_rows,
    print_table,
    state_of,
)
from dpsynth_cli.options import (
    CliTyper,
    JsonFlag,
    Output,
    YesFlag,
    confirm_irreversible,
    output_mode,
    print_id,
)
from dpsynth_cli.summaries import dataset_line
from dpsynth_cli.uploads import check_labels, prepared_upload
from dpsynth_cli.views import budget_lines

datasets = CliTyper(help="Upload and inspect datasets; make-documents writes public "
                    "synthetic documents with layout masks (public pretraining data).")
DatasetIdArg = Annotated[str, typer.Argument(help="a dataset id (ds_...)", show_default=False)]


def print_created(body: dict[str, Any], mode: Output, id_key: str,
                   line: Callable[[dict[str, Any]], str]) -> None:
    """What an upload or derivation prints: the id alone (``--quiet``), the api's body
    (``--json``) or a one-line summary."""
    if mode is Output.QUIET:
        print_id(body[id_key])
    elif mode is Output.JSON:
        print_json(body)
    else:
        console.print(line(body), highlight=False, soft_wrap=True)


def _print_fields(body: dict[str, Any], fields: list[tuple[str, str]]) -> None:
    """``label  value`` lines of the ``fields`` (label, key) the body has."""
    rows = [(label, body[key]) for label, key in fields if body.get(key) not in (None, [], {})]
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        console.print(f"{label:<{width}}  {text}", highlight=False, soft_wrap=True)


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
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(
        exists=True, show_default=False,
        help="the data: a folder (zipped here before sending), a zip/tar image folder, an "
        ".npz or a Parquet file (docs/datasets.md)")],
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
    partitions_disjoint: Annotated[bool, typer.Option(
        "--partitions-disjoint",
        help="private: every record (subject) is in one class, so per-label jobs compose in "
        "parallel; checked at upload (the default for images)")] = False,
    partitions_overlap: Annotated[bool, typer.Option(
        "--partitions-overlap",
        help="private: a record (subject) may be in several classes (the default for "
        "subjects)")] = False,
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
        envvar="DPSYNTH_HOLDOUT_KEY", show_default=False, show_envvar=False,
        help="write-only key of the held-out hash (≥ 16 characters; never stored or "
        "shown): the same key holds out the same records in every version of a dataset "
        "(default: one drawn by the api). Prefer the DPSYNTH_HOLDOUT_KEY variable to the "
        "command line")] = None,
    holdout_from: Annotated[str | None, typer.Option(
        help="Hugging Face split folders (train/<label>/..., test/<label>/...): hold out "
        "this split (test | validation), as you split it, instead of --holdout-fraction")]
    = None,
    label_column: Annotated[str | None, typer.Option(
        help="metadata.csv / metadata.jsonl: the column holding the labels (default "
        "'label')")] = None,
    json_: JsonFlag = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the new dataset's id (for X=$(dpsynth ...))")]
    = False,
) -> None:
    """Upload a folder, zip/tar image folder, .npz or Parquet file; prints the new dataset's
    id, size, classes and budget. The format and the labels are checked here first."""
    mode = output_mode(json_, quiet)
    if partitions_disjoint and partitions_overlap:
        raise typer.BadParameter("give one of --partitions-disjoint, --partitions-overlap",
                                 param_hint="--partitions-overlap")
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
    if holdout_from not in {None, "test", "validation"}:
        raise typer.BadParameter("must be test or validation", param_hint="--holdout-from")
    if holdout_from is not None and holdout_fraction is not None:
        raise typer.BadParameter("give one of --holdout-from, --holdout-fraction",
                                 param_hint="--holdout-from")
    if holdout_key is not None and holdout_fraction is None:
        raise typer.BadParameter("needs --holdout-fraction", param_hint="--holdout-key")
    if visibility == "private" and declared_size is None and size_epsilon is None:
        raise typer.BadParameter(
            "a private dataset states the size it makes public: --declared-size N (an upper "
            "bound on its records, or subjects, shown to every reader) or --size-epsilon E "
            "(a DP count of them, charged to its budget)", param_hint="--declared-size")
    check_labels(path, _split(label_domain), label_column=label_column)  # before any byte
    with prepared_upload(path) as sent:  # a folder is zipped; another format is refused
        result = state_of(ctx).client().upload_dataset(
            sent, name=name, visibility=visibility, epsilon_limit=epsilon_limit, delta=delta,
            label_domain=_split(label_domain), declared_size=declared_size,
            size_epsilon=size_epsilon,
            partitions_disjoint=True if partitions_disjoint else False if partitions_overlap
            else None,
            class_sizes=_sizes(class_sizes), on_overlap=on_overlap, privacy_unit=privacy_unit,
            subject_column=subject_column, holdout_fraction=holdout_fraction,
            holdout_key=holdout_key, on_duplicate=on_duplicate, holdout_from=holdout_from,
            label_column=label_column)
    print_created(result, mode, "dataset_id", dataset_line)


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


@datasets.command("make-forms")
def make_forms_file(
    out: Annotated[Path, typer.Argument(dir_okay=False, help="the .json or .json.gz to write")],
    count: Annotated[int, typer.Option(min=1, max=100_000, help="how many forms")] = 200,
    seed: Annotated[int, typer.Option(min=0, help="generator seed")] = 0,
    subjects: Annotated[int | None, typer.Option(min=1, help="give each form an owner "
                                                 "'owner-<k>', k < SUBJECTS")] = None,
) -> None:
    """Write PUBLIC synthetic forms with key information (docs/documents-kie.md; no api
    call): invoices, receipts and bills as words, 0..1000 word boxes and BIO labels
    (invoice number, date, due date, vendor, customer, subtotal, tax, total)."""
    from dpsynth_shared.documents.forms import write_forms

    path = write_forms(out, count, seed=seed, subjects=subjects)
    console.print(f"wrote {path}: {count} public synthetic forms (dpsynth-kie/1), seed "
                  f"{seed}", highlight=False, soft_wrap=True)


@datasets.command("list")
@cli_errors
def list_datasets(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """Your datasets."""
    rows = state_of(ctx).client().list_datasets()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["dataset_id", "name", "visibility", "declared_size", "created_at"],
                "datasets")


DATASET_FIELDS = [("classes", "class_names"), ("class sizes", "class_sizes"),
                  ("privacy unit", "privacy_unit"), ("delta", "delta"),
                  ("derived from", "parent_id"), ("derivation", "derivation"),
                  ("format", "source_format"), ("created", "created_at"),
                  ("deleted", "deleted_at")]


@datasets.command("show")
@cli_errors
def show_dataset(ctx: typer.Context, dataset_id: DatasetIdArg, json_: JsonFlag = False) -> None:
    """One dataset: size, classes, budget, held-out part (`dpsynth budget` for the epsilons
    spent)."""
    body = state_of(ctx).client().get_dataset(dataset_id)
    if json_:
        print_json(body)
        return
    console.print(dataset_line(body), highlight=False, soft_wrap=True)
    _print_fields(body, DATASET_FIELDS)


@datasets.command("release-class-sizes")
@cli_errors
def release_class_sizes(
    ctx: typer.Context, dataset_id: DatasetIdArg,
    epsilon: Annotated[float, typer.Option("--epsilon", help="the release's epsilon, charged "
                                           "to the dataset's budget")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show sigma and the budget "
                                          "impact; charge nothing")] = False,
    json_: JsonFlag = False,
) -> None:
    """Release the class sizes (per-label training) through a charged DP histogram."""
    body = state_of(ctx).client().release_class_sizes(dataset_id, epsilon=epsilon,
                                                      dry_run=dry_run)
    if json_:
        print_json(body)
        return
    verb = "would spend" if body.get("dry_run") else "spent"
    console.print(f"class sizes release {verb} epsilon {body.get('epsilon')} (sigma "
                  f"{body.get('sigma')}); dataset spent (RDP filter) "
                  f"{body.get('dataset_epsilon_spent_before')} -> "
                  f"{body.get('dataset_epsilon_spent_after')}, "
                  f"{body.get('dataset_epsilon_remaining_after')} left", highlight=False,
                  soft_wrap=True)
    if body.get("class_sizes"):
        console.print("class sizes: " + ", ".join(
            f"{k}={v}" for k, v in body["class_sizes"].items()), highlight=False,
            soft_wrap=True)


@datasets.command("derive")
@cli_errors
def derive_dataset(
    ctx: typer.Context, dataset_id: DatasetIdArg,
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
    json_: JsonFlag = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="print only the new dataset's id (for X=$(dpsynth ...))")]
    = False,
) -> None:
    """Derive a class subset or a train/holdout split (a selection, no copy; a private one
    charges its parent's budget, sampled at q = batch / N̂ of the child)."""
    mode = output_mode(json_, quiet)
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
    print_created(result, mode, "dataset_id", dataset_line)


@datasets.command("holdout")
@cli_errors
def list_held_out(ctx: typer.Context, dataset_id: DatasetIdArg, json_: JsonFlag = False
                  ) -> None:
    """The upload's held-out records (owner scope): each record's position in the upload
    and its sha256 content hash, to reproduce an evaluation outside the platform."""
    items = state_of(ctx).client().list_held_out(dataset_id)
    if json_:
        print_json({"items": items})
        return
    print_table(items, ["index", "record_hash"], f"{len(items)} held-out records")


@datasets.command("delete")
@cli_errors
def delete_dataset(
    ctx: typer.Context, dataset_id: DatasetIdArg,
    yes: YesFlag = False,
    json_: JsonFlag = False,
) -> None:
    """Delete a dataset's data (owner scope). Its budget, ledger entries and record hashes
    remain: a re-upload of its records is still refused, or linked to the same budget.
    Asks for confirmation; --yes skips it."""
    confirm_irreversible(f"delete the data of dataset {dataset_id}", yes=yes)
    body = state_of(ctx).client().delete_dataset(dataset_id)
    if json_:
        print_json(body)
        return
    console.print(f"deleted the data of dataset {body.get('dataset_id', dataset_id)} at "
                  f"{body.get('deleted_at')}; its budget, ledger entries and record hashes "
                  "remain", highlight=False, soft_wrap=True)


@datasets.command("set-limit")
@cli_errors
def set_limit(
    ctx: typer.Context, dataset_id: DatasetIdArg,
    epsilon_limit: Annotated[float | None, typer.Option(
        help="the new, LOWER limit (a limit is never raised; below what is spent it only "
        "blocks new work)")] = None,
    warning_fraction: Annotated[float | None, typer.Option(
        help="warn when spent reaches this fraction of the limit (default 0.8)")] = None,
    json_: JsonFlag = False,
) -> None:
    """Lower a private dataset's epsilon limit and/or set its warning fraction."""
    if epsilon_limit is None and warning_fraction is None:
        raise typer.BadParameter("give --epsilon-limit and/or --warning-fraction")
    body = state_of(ctx).client().update_budget(dataset_id, epsilon_limit=epsilon_limit,
                                                warning_fraction=warning_fraction)
    _print_budget(body, json_)


@cli_errors
def budget(ctx: typer.Context, dataset_id: DatasetIdArg, json_: JsonFlag = False) -> None:
    """A private dataset's privacy budget: limit, spent, tight figure, reserved, remaining
    (docs/epsilons.md explains each)."""
    _print_budget(state_of(ctx).client().get_budget(dataset_id), json_)


def _print_budget(body: dict[str, Any], json_: bool) -> None:
    if json_:
        print_json(body)
        return
    print_rows(budget_lines(body), styles={"warning": "bold yellow"})
