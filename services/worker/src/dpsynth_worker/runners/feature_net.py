"""Training a feature network on a PUBLIC dataset (non-private; evaluate jobs' feature space).

The network is a small CNN classifier (``dpsynth-featnet-v1``); its penultimate layer is the
feature space of the platform's Fréchet distance, k-NN precision/recall/density/coverage and
feature-space memorisation check. Its accuracy on validation records it never trained on (the
dataset's held-out records when it has them, else a seeded ``validation_fraction``) and the
sha256 of its weights are recorded in the model's metadata: an evaluation re-measures the
accuracy and refuses a network below its threshold (a random network must fail).

Only public data is read, without any read grant: a network trained on private data would
carry that data into every report that uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ids import new_model_id
from dpsynth_shared.job_specs import FeatureNetSpec
from dpsynth_shared.job_states import JobState
from dpsynth_shared.object_store import PRIVATE_PREFIX
from dpsynth_shared.worker_contract import DatasetInfo

from dpsynth_worker.devices import first_device
from dpsynth_worker.ml_port import Labels
from dpsynth_worker.runners.artifacts import (
    model_key,
    tar_folder,
    upload_and_register,
    write_provenance,
)
from dpsynth_worker.runners.context import JobContext
from dpsynth_worker.runners.outcome import Outcome, propose, stopped
from dpsynth_worker.runners.selection import fetch_dataset

if TYPE_CHECKING:
    from dpsynth_ml import ImageDataset

log = logging.getLogger(__name__)


def validation_split(n: int, *, seed: int, fraction: float) -> tuple[Labels, Labels]:
    """The seeded validation split of a dataset without held-out records, as
    ``(validation indices, training indices)``, both sorted.

    The worker draws it (and hands the validation records to the trainer) so that an
    evaluation can rebuild exactly the records the network never trained on from the
    ``validation`` block of the model's provenance. Same draw as
    :func:`dpsynth_ml.train_feature_net` makes on its own.
    """
    import numpy as np

    order = np.random.default_rng(seed).permutation(n)
    n_val = round(fraction * n)
    return np.sort(order[:n_val]), np.sort(order[n_val:])


class _Stop(Exception):
    """Raised from the progress callback to leave training at an epoch/batch boundary."""


def require_public(dataset: DatasetInfo | None, what: str) -> DatasetInfo:
    """The dataset, if it is public and stored outside the private prefix (defence in depth:
    the api resolves only public datasets into these claims).

    Raises:
        DpsynthError: ``visibility_mismatch`` otherwise.
    """
    if dataset is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, f"the claim has no {what}")
    keys = [dataset.object_key, dataset.holdout_object_key or ""]
    if dataset.visibility != "public" or any(k.startswith(PRIVATE_PREFIX) for k in keys):
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH, f"the {what} must be a public "
                           "dataset", dataset_id=dataset.dataset_id)
    return dataset


def load_public(ctx: JobContext, dataset: DatasetInfo,
                name: str) -> tuple[ImageDataset, ImageDataset | None]:
    """Download a public dataset (its selection applied) and its held-out records, if any."""
    path = ctx.work_dir / f"{name}.npz"
    fetch_dataset(ctx, dataset, path)  # public: no read grant
    data = ctx.ml.load_dataset(path)
    holdout = None
    if dataset.holdout_object_key:
        hpath = ctx.work_dir / f"{name}-holdout.npz"
        ctx.store.get_file(dataset.holdout_object_key, hpath)
        holdout = ctx.ml.load_dataset(hpath)
        if tuple(holdout.class_names) != tuple(data.class_names):
            raise DpsynthError(ErrorCode.INVALID_DATASET, f"the held-out records of dataset "
                               f"{dataset.dataset_id} have other classes than the dataset")
    return data, holdout


def run_feature_net(ctx: JobContext) -> Outcome:
    """Download the public dataset, train the network, publish it, propose ``succeeded``."""
    spec = FeatureNetSpec.model_validate(ctx.claim.spec)
    dataset = require_public(ctx.claim.dataset, "feature network's training dataset")
    if dataset.dataset_id != spec.dataset_id:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "the claim's dataset is not the spec's")
    ctx.heartbeat.phase("downloading dataset")
    data, holdout = load_public(ctx, dataset, "data")
    out_dir = ctx.work_dir / "feature_net"
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx.heartbeat.phase("training")

    def progress(done: int, total: int) -> None:
        ctx.heartbeat.progress(done, total)
        if ctx.flags.any():
            raise _Stop

    images, labels = data.images, data.labels
    validation: dict[str, object] = {"source": "holdout"}
    if holdout is not None:
        val_images, val_labels = holdout.images, holdout.labels
    else:
        val_idx, train_idx = validation_split(len(labels), seed=spec.seed,
                                              fraction=spec.validation_fraction)
        val_images, val_labels = images[val_idx], labels[val_idx]
        images, labels = images[train_idx], labels[train_idx]
        validation = {"source": "split", "seed": spec.seed,
                      "fraction": spec.validation_fraction}
    try:
        info = ctx.ml.train_feature_net(
            images, labels, class_names=list(data.class_names), image_size=spec.image_size,
            channels=spec.channels, epochs=spec.epochs, batch_size=spec.batch_size,
            learning_rate=spec.learning_rate, seed=spec.seed, out_dir=out_dir,
            val_images=val_images, val_labels=val_labels,
            validation_fraction=spec.validation_fraction, progress=progress,
            device=first_device(ctx.ml.devices))
    except _Stop:
        return stopped(ctx)
    if ctx.flags.any():
        return stopped(ctx)
    validation["size"] = int(info.validation_size)
    feature = info.to_dict()
    published = _publish(ctx, out_dir, dataset=dataset, feature=feature, validation=validation)
    propose(ctx, JobState.SUCCEEDED, result={
        **published, "accuracy": float(info.accuracy),
        "validation_size": int(info.validation_size)})
    log.info("feature network trained", extra={"accuracy": float(info.accuracy),
                                               "validation_size": int(info.validation_size)})
    return Outcome.SUCCEEDED


def _publish(ctx: JobContext, folder: Path, *, dataset: DatasetInfo, feature: dict[str, Any],
             validation: Mapping[str, object]) -> dict[str, str]:
    """Stamp, hash, tar, upload and register the network folder as a ``model``.

    The provenance's ``validation`` block says which records the accuracy was measured on
    (``holdout``, or the seeded ``split`` of ``fraction``): evaluations re-measure it there.
    """
    ctx.heartbeat.phase("uploading model")
    write_provenance(folder, {"dp": False, "job_ids": [ctx.job_id], "model_kind": "feature_net",
                              "public_dataset_id": dataset.dataset_id,
                              "validation": validation})
    digest = ctx.ml.model_hash(folder)
    model_id = new_model_id()
    archive = tar_folder(folder, ctx.work_dir / "model.tar")
    metadata = {"model_id": model_id, "model_hash": digest, "model_kind": "feature_net",
                "feature_net": feature, "public_dataset_id": dataset.dataset_id, "dp": False,
                "class_names": list(feature.get("class_names") or dataset.class_names),
                "image_size": feature.get("image_size"), "channels": feature.get("channels"),
                "training_kind": "feature_net", "validation": validation}
    registered = upload_and_register(ctx, key=model_key(model_id), path=archive, kind="model",
                                     metadata=metadata)
    archive.unlink()
    return {"model_id": registered.model_id or model_id,
            "artifact_id": registered.artifact_id, "model_hash": digest}
