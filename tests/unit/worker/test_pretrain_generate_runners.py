"""The pretrain and generate runners with fake ports and the real tiny ML core."""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path

from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import Claim, DatasetInfo, HeartbeatReply, ModelRef
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import (
    PROVENANCE_FILE,
    corpus_key,
    model_key,
    write_provenance,
)

from tests.unit.worker.conftest import CLASS_NAMES, World


def _generate_claim(world: World, ref: ModelRef, samples_per_class: int = 2) -> Claim:
    spec = {"type": "generate", "model_id": ref.model_id,
            "samples_per_class": samples_per_class, "sampler": "ddim", "steps": 2,
            "guidance_scale": 2.0, "seed": 7}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="generate", spec=spec,
                 base_model=ref, lease_ttl_s=60, heartbeat_s=10)


def test_pretrain_publishes_a_non_dp_model(world: World) -> None:
    key = "public/datasets/ds_pub/data.npz"
    world.store.put_file(key, world.digits_npz)
    spec = {"type": "pretrain", "dataset_id": "ds_pub", "preset": "tiny", "image_size": 16,
            "epochs": 1, "batch_size": 25}
    claim = Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="pretrain", spec=spec,
                  dataset=DatasetInfo(dataset_id="ds_pub", visibility="public", object_key=key,
                                      class_names=CLASS_NAMES),
                  lease_ttl_s=60, heartbeat_s=10)
    assert world.run(claim) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["dp"] is False and meta["preset"] == "tiny"
    assert meta["class_names"] == CLASS_NAMES and meta["rng"] == "os"
    assert meta["trainable_parameters"] == meta["total_parameters"] > 0
    assert model.object_key == model_key(meta["model_id"])
    with tarfile.open(world.store.root / model.object_key) as tar:
        names = tar.getnames()
        provenance = json.load(tar.extractfile(PROVENANCE_FILE))  # type: ignore[arg-type]
    assert "dpsynth_model.json" in names and "unet/config.json" in names
    assert provenance["dp"] is False
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED and final.result["model_id"] == meta["model_id"]
    assert world.ledger.calls == []
    assert world.api.heartbeats[-1].step == world.api.heartbeats[-1].total > 0


def test_generate_from_a_non_dp_model_has_null_epsilons(world: World) -> None:
    model_id = world.upload_model()
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id), job_ids=["job_pre"])
    assert world.run(_generate_claim(world, ref)) == Outcome.SUCCEEDED
    (corpus,) = world.api.of_kind("corpus")
    assert corpus.object_key == corpus_key(world.job_id)
    with zipfile.ZipFile(world.store.root / corpus.object_key) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        pngs = [n for n in zf.namelist() if n.endswith(".png")]
    assert len(pngs) == 20
    assert manifest["dp"] is False and manifest["job_epsilon"] is None
    assert manifest["dataset_epsilon_spent"] is None and manifest["delta"] is None
    assert manifest["counts"] == {name: 2 for name in CLASS_NAMES}
    assert manifest["job_ids"] == ["job_pre", world.job_id]
    assert manifest["seed"] == 7 and manifest["sampler"] == "ddim"
    assert manifest["non_dp_evaluations"] == []
    assert world.ledger.calls == []
    assert world.api.final.result["images"] == 20


def test_generate_from_a_dp_model_reads_the_budget_view(world: World, tmp_path: Path) -> None:
    folder = tmp_path / "dp-model"
    shutil.copytree(world.pretrained_dir, folder)
    write_provenance(folder, {"dp": True, "dataset_id": "ds_priv", "job_epsilon": 0.9,
                              "job_ids": ["job_ft"], "reservation_ids": ["res_1"]})
    model_id = world.upload_model(folder)
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id), dataset_id="ds_priv",
                   job_ids=["job_ft"], dp=True)
    assert world.run(_generate_claim(world, ref, samples_per_class=1)) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["dp"] is True and manifest["job_epsilon"] == 0.9
    assert manifest["dataset_epsilon_spent"] == 2.5
    assert manifest["dataset_tight_epsilon"] == 1.7
    assert "not a guarantee" in manifest["dataset_tight_epsilon_label"]
    assert manifest["delta"] == 1e-5 and manifest["admission_order"] == 12
    assert manifest["accountant"] == "rdp-filter+pld"
    assert len(manifest["model_hash"]) == 64
    assert world.ledger.names() == ["budget_view"]  # generation costs no budget


def test_cancel_during_sampling(world: World) -> None:
    world.api.on_heartbeat = lambda beat: HeartbeatReply(
        cancel_requested=beat.step >= 1, state="cancelling" if beat.step >= 1 else "running")
    model_id = world.upload_model()
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id))
    assert world.run(_generate_claim(world, ref)) == Outcome.CANCELLED
    assert world.api.of_kind("corpus") == []
    assert world.api.final.to_state == JobState.CANCELLED


def test_pretrain_refuses_a_private_dataset(world: World) -> None:
    claim = Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="pretrain",
                  spec={"type": "pretrain", "dataset_id": "ds_x"},
                  dataset=DatasetInfo(dataset_id="ds_x", visibility="private",
                                      object_key="private/datasets/ds_x/data.npz",
                                      class_names=CLASS_NAMES),
                  lease_ttl_s=60, heartbeat_s=10)
    assert world.run(claim) == Outcome.FAILED
    assert world.api.final.error_code == "visibility_mismatch"
    assert world.api.artifacts == []
