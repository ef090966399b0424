"""Fixtures for the worker's runners: fake ports, a real local store, the real ML core.

The ML core runs at the tiny preset on 16x16 digits (seconds per job on 2 CPU cores).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dpsynth_ml import PretrainTraining, train
from dpsynth_shared.stores.local import LocalDirStore
from dpsynth_shared.worker_contract import Claim, DatasetInfo, ModelRef
from dpsynth_worker.runners import Outcome, run_job
from dpsynth_worker.runners.artifacts import model_key, tar_folder

from tests.unit.worker.fakes import FakeApi, FakeLedger, FakeReservation

torch.set_num_threads(2)

NUM_RECORDS = 50
CLASS_NAMES = [f"digit {i}" for i in range(10)]


def _hex(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def digits_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:NUM_RECORDS] / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    path = tmp_path_factory.mktemp("data") / "digits.npz"
    np.savez(path, images=images, labels=digits.target[:NUM_RECORDS].astype(np.int64),
             class_names=np.array(CLASS_NAMES))
    return path


@pytest.fixture(scope="session")
def pretrained_dir(tmp_path_factory: pytest.TempPathFactory, digits_npz: Path) -> Path:
    spec = PretrainTraining(preset="tiny", image_size=16, epochs=1, batch_size=25,
                            learning_rate=1e-3, seed=0)
    out = tmp_path_factory.mktemp("pretrained")
    return train(spec, dataset_path=digits_npz, out_dir=out).model_dir


@pytest.fixture()
def ledger() -> FakeLedger:
    return FakeLedger()


@pytest.fixture()
def store(tmp_path: Path, ledger: FakeLedger) -> LocalDirStore:
    return LocalDirStore(tmp_path / "objects", grant_public_key=ledger.public_key)


class World:
    """One test's platform: fake api + ledger, a real local store, a work dir."""

    def __init__(self, tmp_path: Path, store: LocalDirStore, ledger: FakeLedger,
                 digits_npz: Path, pretrained_dir: Path) -> None:
        self.tmp_path, self.store, self.ledger = tmp_path, store, ledger
        self.digits_npz, self.pretrained_dir = digits_npz, pretrained_dir
        self.job_id = _hex("job")
        self.api = FakeApi(claim_result=Exception())  # type: ignore[arg-type]
        self.work_dir = tmp_path / "work"

    def upload_model(self, folder: Path | None = None) -> str:
        model_id = _hex("mdl")
        archive = tar_folder(folder or self.pretrained_dir, self.tmp_path / f"{model_id}.tar")
        self.store.put_file(model_key(model_id), archive)
        return model_id

    def finetune_claim(self, *, steps: int = 12, checkpoint_every: int = 5,
                       reserved: int | None = None, class_map: dict[str, str] | None = None,
                       attempt: int = 1, **claim_extra: Any) -> Claim:
        dataset_id = _hex("ds")
        key = f"private/datasets/{dataset_id}/data.npz"
        self.store.put_file(key, self.digits_npz)
        res = self.ledger.add(FakeReservation(
            reservation_id=_hex("res"), job_id=self.job_id, dataset_id=dataset_id,
            noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8,
            planned_steps=steps, steps_reserved=steps if reserved is None else reserved))
        self.planned_steps = steps
        model_id = self.upload_model()
        training: dict[str, Any] = {"expected_batch_size": 8, "max_physical_batch_size": 8,
                                    "checkpoint_every": checkpoint_every,
                                    "learning_rate": 1e-3}
        if class_map is not None:
            training["class_map"] = class_map
        spec = {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
                "privacy": {"target_epsilon": 1.0, "max_grad_norm": 1.0},
                "training": training}
        return Claim(job_id=self.job_id, tenant_id="ten_x", attempt=attempt, type="finetune",
                     spec=spec, reservation_id=res.reservation_id,
                     dataset=DatasetInfo(dataset_id=dataset_id, visibility="private",
                                         object_key=key, class_names=CLASS_NAMES,
                                         declared_size=NUM_RECORDS, delta=1e-5),
                     base_model=ModelRef(model_id=model_id, object_key=model_key(model_id)),
                     lease_ttl_s=60, heartbeat_s=10, **claim_extra)

    def run(self, claim: Claim | Exception, **kwargs: Any) -> Outcome:
        self.api.claim_result = claim  # type: ignore[assignment]
        attempt = claim.attempt if isinstance(claim, Claim) else 1
        kwargs.setdefault("heartbeat_s", 0.0)
        return run_job(self.job_id, attempt, api=self.api, ledger=self.ledger, store=self.store,
                       work_dir=self.work_dir, worker_id="w-test", **kwargs)


@pytest.fixture()
def world(tmp_path: Path, store: LocalDirStore, ledger: FakeLedger, digits_npz: Path,
          pretrained_dir: Path) -> World:
    return World(tmp_path, store, ledger, digits_npz, pretrained_dir)
