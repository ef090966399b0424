"""Loading a dataset for a job, with the selection of a derived dataset applied.

A derived dataset (a class subset or a split, docs/privacy.md "Records, overlap and derived
data") is its parent's canonical object plus a selection (``DatasetInfo.selection``):
``classes`` keeps the records of those classes (labels renumbered to the kept classes, in
the parent's order), then

* ``split`` (``{"rule": "keyed_hash_v1", "key", "fraction", "part"}``) keeps the records
  whose keyed content hash falls below the fraction (``train``) or not (``holdout``): the
  rule of ``dpsynth_shared.record_splits``, over the same content hashes the api stored at
  ingest, so each record's side depends on that record alone (1-stable, issue 13);
* ``indices_key`` (splits made before issue 13) keeps the positions listed in an ``.npy``
  of int64 positions into the class-filtered records.

Every per-record array (images, labels, masks, subjects) is selected together: a record's
mask and subject are part of the record. The selection is applied here, inside the job and
after the read grant, because the api never reads private data after ingest. Errors never
name a record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.record_splits import SPLIT_RULE, in_first_part, record_hashes
from dpsynth_shared.worker_contract import DatasetInfo

from dpsynth_worker.runners.context import JobContext


def fetch_dataset(ctx: JobContext, dataset: DatasetInfo, dest: Path, *,
                  grant: str | None = None) -> Path:
    """Download the dataset's object to ``dest``, narrowed to its selection if it has one.

    Args:
        ctx: the job's context (its object store).
        dataset: the claim's dataset.
        dest: where the (selected) canonical ``.npz`` is written.
        grant: the ledger's read grant (private data); the indices sit under the same
            budget prefix and are read with it.

    Returns:
        ``dest``.
    """
    selection = dataset.selection
    if not selection:
        ctx.store.get_file(dataset.object_key, dest, grant=grant)
        return dest
    whole = dest.with_name(f"{dest.stem}-parent.npz")
    ctx.store.get_file(dataset.object_key, whole, grant=grant)
    indices = None
    if selection.get("indices_key"):
        index_path = dest.with_name(f"{dest.stem}-indices.npy")
        ctx.store.get_file(str(selection["indices_key"]), index_path, grant=grant)
        indices = np.load(index_path, allow_pickle=False)
        index_path.unlink()
    classes = selection.get("classes")
    apply_selection(whole, dest, classes=[str(c) for c in classes] if classes else None,
                    indices=indices, split=selection.get("split"))
    whole.unlink()
    return dest


def split_side(images: np.ndarray, split: object) -> np.ndarray:
    """Which of ``images`` a keyed-hash split keeps: ``[N]`` bool.

    Raises:
        DpsynthError: ``invalid_dataset`` for a split of an unknown rule or shape.
    """
    if not isinstance(split, dict) or split.get("rule") != SPLIT_RULE \
            or split.get("part") not in ("train", "holdout"):
        raise DpsynthError(ErrorCode.INVALID_DATASET, "the derived dataset's split rule is "
                           "not one this worker applies")
    try:
        key, fraction = bytes.fromhex(str(split["key"])), float(split["fraction"])
        first = in_first_part(key, record_hashes(images), fraction)
    except (KeyError, ValueError) as exc:
        raise DpsynthError(ErrorCode.INVALID_DATASET, "the derived dataset's split is "
                           "malformed") from exc
    return first if split["part"] == "train" else ~first


def apply_selection(source: Path, dest: Path, *, classes: list[str] | None,
                    indices: np.ndarray | None, split: object = None) -> None:
    """Write ``source``'s records kept by the selection to ``dest`` (canonical npz).

    Raises:
        DpsynthError: ``invalid_dataset`` when the selection does not fit the object.
    """
    with np.load(source, allow_pickle=False) as npz:
        arrays: dict[str, np.ndarray] = {name: npz[name] for name in npz.files}
    n = int(arrays["images"].shape[0])
    names = [str(c) for c in arrays["class_names"].tolist()]
    labels = arrays["labels"].astype(np.int64)
    keep = np.arange(n)
    remap = None
    if classes is not None:
        if not set(classes) <= set(names):
            raise DpsynthError(ErrorCode.INVALID_DATASET, "the derived dataset's classes are "
                               "not classes of its parent's data")
        wanted = [names.index(c) for c in classes]
        keep = np.flatnonzero(np.isin(labels, wanted))
        remap = np.full(len(names), -1, dtype=np.int64)
        remap[wanted] = np.arange(len(wanted))
    if indices is not None:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1 or (indices.size and (int(indices.min()) < 0
                                                   or int(indices.max()) >= keep.size)):
            raise DpsynthError(ErrorCode.INVALID_DATASET, "the derived dataset's indices do "
                               "not fit its parent's data")
        keep = keep[indices]
    if split is not None:
        keep = keep[split_side(arrays["images"][keep], split)]
    out: dict[str, Any] = {}  # np.savez(**out): its keyword allow_pickle is a bool
    for name, array in arrays.items():
        if name == "class_names":
            continue
        out[name] = array[keep] if array.ndim >= 1 and array.shape[0] == n else array
    if remap is not None and classes is not None:
        out["labels"] = remap[out["labels"].astype(np.int64)]
        out["class_names"] = np.asarray(classes, dtype=str)
    else:
        out["class_names"] = arrays["class_names"]
    if "subjects" in out:  # dense again: 0..S'-1 over the subjects kept
        _, dense = np.unique(out["subjects"], return_inverse=True)
        out["subjects"] = dense.astype(np.int64)
    with dest.open("wb") as fh:
        np.savez(fh, **out)
