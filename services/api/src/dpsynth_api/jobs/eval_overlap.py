"""An evaluate job's reference held-out part must not have been trained on (issue 15, item 8).

An evaluation compares a corpus with the reference's held-out records: real data the
corpus's model never saw. When some of them ARE training records of that model (an upload
linked with ``on_overlap: link`` that shares records with the reference, a dataset derived
from one, a base model pretrained on a public dataset holding them), the report measures
memorisation, not generalisation, and its accuracies and distances read better than they
are. The check runs where evaluate specs are resolved (``kinds.evaluate.resolve_evaluate``:
both the dry run and the submission), before the ledger records any read:

* the LINEAGE of a corpus: the model its generate job sampled and the layout generator that
  drew its masks, each followed through the jobs that produced it to their base models, down
  to an uploaded model (whose training data the platform does not know) or a model trained
  from scratch. Each job names the dataset it trained on;
* the TRAINING records of such a dataset, by content hash (``record_hashes``): an upload's
  (or linked upload's) rows that are not held out; a derived dataset's are its upload's
  training rows kept by its selection (its classes; a keyed-hash split's part, applied to
  the shared hashes only);
* the overlap is one SQL join of the reference's held-out rows with those uploads' rows on
  (tenant, hash): only shared rows come back, never all the hashes of a dataset.

Any shared record refuses the job: 409 ``holdout_trained_on``,
naming the datasets, the jobs and models that trained on them; the counts only with the
``owner`` scope. Where the platform cannot decide (splits made before migration 0008 whose
sides were not recorded; a caller without the owner scope, who may not learn anything of a
private training dataset's records, not even that it holds a public held-out record), the
job is admitted and its privacy block carries ``holdout_overlap`` with ``status: unchecked``
and a caveat for the report's headline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.record_splits import LEGACY_RULE, in_first_part
from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased

from dpsynth_api.datasets.derive import SELECTING_KINDS, selection_of
from dpsynth_api.tables import Artifact, Dataset, Job, Model, RecordHash

_MAX_LINEAGE = 1000


@dataclass(frozen=True)
class Trained:
    """One dataset a model of the corpus's lineage was trained on.

    Attributes:
        dataset: the dataset the job named (an upload, a linked upload or a derived one).
        upload: the upload whose record hashes hold its records (``dataset`` itself unless
            derived).
        model_id: the model the job produced.
        job_id: the job that trained it.
        job_type: ``pretrain``, ``finetune`` ...
        role: where the model stands, e.g. "the model that generated the corpus".
    """

    dataset: Dataset
    upload: Dataset
    model_id: str
    job_id: str
    job_type: str
    role: str

    def view(self) -> dict[str, Any]:
        out = {"dataset_id": self.dataset.id, "model_id": self.model_id,
               "job_id": self.job_id, "job_type": self.job_type, "role": self.role}
        if self.upload.id != self.dataset.id:
            out["upload_dataset_id"] = self.upload.id
        return out


@dataclass(frozen=True)
class Shared:
    """What one trained-on dataset shares with the held-out part (``records`` counts every
    shared hash: images, and subjects for a subject-unit reference)."""

    trained: Trained
    records: int
    subjects: int
    undecided: int  # shared rows whose training side is not recorded (legacy splits)


@dataclass
class HoldoutCheck:
    """The outcome of the check, as the job's privacy block shows it."""

    checked: list[str] = field(default_factory=list)
    unchecked: list[dict[str, str]] = field(default_factory=list)
    unknown_models: list[str] = field(default_factory=list)

    @property
    def status(self) -> Literal["no_overlap", "unchecked"]:
        return "unchecked" if self.unchecked else "no_overlap"

    def caveat(self) -> str | None:
        """The report's headline caveat, or None when everything was checked."""
        if not self.unchecked:
            return None
        what = "; ".join(f"{u['what']}: {u['why']}" for u in self.unchecked)
        return ("held-out overlap not checked: the platform could not verify that the "
                "reference's held-out records were never trained on by the corpus's model "
                f"({what}); if some were, these numbers read better than they are")

    def block(self) -> dict[str, Any]:
        return {"status": self.status, "checked_datasets": sorted(set(self.checked)),
                "unchecked": list(self.unchecked),
                "models_of_unknown_training_data": sorted(set(self.unknown_models)),
                "caveat": self.caveat()}


def _upload_of(session: Session, dataset: Dataset) -> Dataset:
    """The upload (or linked upload) whose records a derived dataset selects."""
    row, hops = dataset, 0
    while ((row.derivation or {}).get("kind") in SELECTING_KINDS and row.parent_id
           and hops < _MAX_LINEAGE):
        parent = session.get(Dataset, row.parent_id)
        if parent is None or parent.tenant_id != dataset.tenant_id:
            break
        row, hops = parent, hops + 1
    return row


def _starts(session: Session, artifact: Artifact) -> list[tuple[str, str]]:
    """The models a corpus comes from: the sampled model and its layout generator."""
    producer = session.get(Job, artifact.job_id)
    sampled = (producer.model_id if producer is not None else None) or artifact.model_id
    out = [(sampled, "the model that generated the corpus")] if sampled else []
    layout = ((producer.spec or {}).get("layout_source") or {}) if producer else {}
    if isinstance(layout, dict) and layout.get("model_id"):
        out.append((str(layout["model_id"]), "the layout generator of the corpus"))
    return out


def lineage(session: Session, artifact: Artifact) -> tuple[list[Trained], list[str]]:
    """The datasets the corpus's models were trained on, and the uploaded models among them
    (their training data is not known to the platform)."""
    trained: list[Trained] = []
    uploaded: list[str] = []
    seen: set[str] = set()
    for start, role in _starts(session, artifact):
        current: str | None = start
        depth = 0
        while current and current not in seen and len(seen) < _MAX_LINEAGE:
            seen.add(current)
            model = session.get(Model, current)
            if model is None or model.tenant_id != artifact.tenant_id:
                break
            job = session.get(Job, model.produced_by_job_id) if model.produced_by_job_id \
                else None
            if job is None:
                uploaded.append(model.id)
                break
            dataset = session.get(Dataset, job.dataset_id) if job.dataset_id else None
            if dataset is not None and dataset.tenant_id == artifact.tenant_id:
                where = role if depth == 0 else f"a base model of {start}, {role}"
                trained.append(Trained(dataset=dataset, upload=_upload_of(session, dataset),
                                       model_id=model.id, job_id=job.id, job_type=job.type,
                                       role=where))
            current, depth = job.model_id, depth + 1
    return trained, uploaded


def _shared_rows(session: Session, reference: Dataset,
                 upload_ids: Sequence[str]) -> list[Any]:
    """The uploads' rows (not held out) whose hash is a held-out hash of the reference.

    One join on (tenant, hash) (``ix_record_hashes_tenant_hash``) from the reference's
    held-out rows: only shared rows are returned.
    """
    if not upload_ids:
        return []
    held = aliased(RecordHash)
    other = aliased(RecordHash)
    stmt = (select(other.dataset_id, other.record_hash, other.label, other.held_out,
                   held.position.is_(None).label("unit_row"))
            .join(other, and_(other.tenant_id == held.tenant_id,
                              other.record_hash == held.record_hash))
            .where(held.dataset_id == reference.id, held.tenant_id == reference.tenant_id,
                   held.held_out.is_(True), other.dataset_id.in_(sorted(set(upload_ids))),
                   other.held_out.is_not(True))
            .distinct())
    return list(session.execute(stmt).all())


def kept_by_selection(trained: Trained, rows: list[Any]) -> tuple[list[Any], bool]:
    """The rows a derived dataset keeps (its classes, its keyed-hash part), and whether that
    is exact (False for a split made before issue 13, whose positions are not re-derived)."""
    selection = selection_of(trained.dataset) or {}
    names = list(trained.upload.class_names)
    classes = selection.get("classes")
    if isinstance(classes, list):
        wanted = {names.index(str(c)) for c in classes if str(c) in names}
        # a subject row has no class: kept (a subject of the upload may be in the subset)
        rows = [r for r in rows if r.label is None or r.label in wanted]
    split = selection.get("split")
    if isinstance(split, dict) and split.get("key") and rows:
        first = in_first_part(bytes.fromhex(str(split["key"])),
                              [str(r.record_hash) for r in rows], float(split["fraction"]))
        keep = first if split.get("part") == "train" else ~first
        rows = [r for r, k in zip(rows, keep.tolist(), strict=True) if k]
    return rows, "indices_key" not in selection


def find_shared(session: Session, reference: Dataset,
                trained: Sequence[Trained]) -> list[Shared]:
    """What each trained-on dataset shares with the reference's held-out records."""
    rows = _shared_rows(session, reference, [t.upload.id for t in trained])
    out: list[Shared] = []
    for item in trained:
        mine = [r for r in rows if r.dataset_id == item.upload.id]
        mine, exact = kept_by_selection(item, mine)
        # a row without a recorded side: trained on unless its upload held records out
        # (a split made before migration 0008: which side it fell on is unknown)
        unknown_side = item.upload.holdout_fraction is not None
        sure = [r for r in mine if r.held_out is False or not unknown_side]
        unsure = len({r.record_hash for r in mine} - {r.record_hash for r in sure})
        if not exact:
            sure, unsure = [], len({r.record_hash for r in mine})
        hashes = {r.record_hash for r in sure}
        units = {r.record_hash for r in sure if r.unit_row}
        if hashes or unsure:
            out.append(Shared(trained=item, records=len(hashes - units), subjects=len(units),
                              undecided=unsure))
    return out


def _refuse(reference: Dataset, artifact: Artifact, found: list[Shared], *,
            owner: bool) -> DpsynthError:
    """The refusal: which datasets, jobs and models; how many records for the owner only."""
    parts, overlaps = [], []
    for s in found:
        t = s.trained
        where = (f"dataset {t.dataset.id}, on which {t.job_type} job {t.job_id} trained "
                 f"model {t.model_id} ({t.role})")
        view = t.view()
        if owner:
            view.update(records=s.records, subjects=s.subjects)
            count = f"{s.records} record(s)" + (f" and {s.subjects} subject(s)"
                                                if s.subjects else "")
            parts.append(f"{count} are training records of {where}")
        else:
            parts.append(f"some are training records of {where}")
        overlaps.append(view)
    how = "" if owner else " (an owner key is told how many)"
    return DpsynthError(
        ErrorCode.HOLDOUT_TRAINED_ON,
        f"the held-out records of dataset {reference.id} were trained on by the model "
        f"lineage of corpus {artifact.id}: {'; '.join(parts)}{how}. An evaluation against "
        "them would measure memorisation, not generalisation. Evaluate against a reference "
        "whose held-out records these models never saw, or a corpus of a model not trained "
        "on them",
        reference_dataset_id=reference.id,
        corpus_artifact_id=artifact.id, overlaps=overlaps)


def check_holdout_not_trained_on(session: Session, *, reference: Dataset, artifact: Artifact,
                                 owner: bool) -> HoldoutCheck:
    """Refuse an evaluation whose reference held-out records the corpus's model trained on.

    Args:
        reference: the reference dataset (an upload with a held-out part).
        artifact: the corpus.
        owner: whether the caller has the ``owner`` scope; without it, private training
            datasets are not checked (the answer would tell something of their records),
            and the refusal carries no counts.

    Returns:
        What was checked and what could not be (the job's privacy block carries it).

    Raises:
        DpsynthError: 409 ``holdout_trained_on``.
    """
    result = HoldoutCheck()
    trained, result.unknown_models = lineage(session, artifact)
    if (reference.holdout_rule or LEGACY_RULE) == LEGACY_RULE:
        result.unchecked.append({"what": f"dataset {reference.id}", "why": (
            f"its held-out split was made by the {LEGACY_RULE} rule, before the platform "
            "recorded each record's side")})
        trained = []
    visible = [t for t in trained if owner or "private" not in
               (t.dataset.visibility, t.upload.visibility)]
    for t in trained:
        if t not in visible:
            result.unchecked.append({"what": f"dataset {t.dataset.id} ({t.role})", "why": (
                "private training data is checked against the held-out part only for a "
                "caller with the owner scope")})
    found = find_shared(session, reference, visible)
    refused = [s for s in found if s.records or s.subjects]
    if refused:
        raise _refuse(reference, artifact, refused, owner=owner)
    for s in found:
        result.unchecked.append({"what": f"dataset {s.trained.dataset.id} ({s.trained.role})",
                                 "why": "which of its records were trained on is not "
                                        "recorded (a split made before migration 0008)"})
    result.checked = [t.dataset.id for t in visible]
    return result
