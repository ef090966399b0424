"""The pretrain and generate runners with fake ports and the real tiny ML core."""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_shared.evaluation import SELECTION_CAVEAT
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


def _generate_claim(world: World, ref: ModelRef, samples_per_class: int = 2,
                    layout_dataset: DatasetInfo | None = None, **spec_extra: Any) -> Claim:
    spec = {"type": "generate", "model_id": ref.model_id,
            "samples_per_class": samples_per_class, "sampler": "ddim", "steps": 2,
            "guidance_scale": 2.0, "seed": 7, **spec_extra}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="generate", spec=spec,
                 base_model=ref, layout_dataset=layout_dataset, lease_ttl_s=60, heartbeat_s=10)


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


def test_an_initialise_only_pretrain_reads_no_data(world: World) -> None:
    """The base of a finetune with no public data: a seeded, untrained pixel-space model."""
    spec = {"type": "pretrain", "initialise_only": True, "class_names": CLASS_NAMES,
            "space": "pixel", "preset": "tiny", "image_size": 16, "seed": 3}
    claim = Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="pretrain",
                  spec=spec, lease_ttl_s=60, heartbeat_s=10)
    assert world.run(claim) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["dp"] is False and meta["initialised_only"] is True and meta["steps"] == 0
    assert meta["class_names"] == CLASS_NAMES and meta["public_dataset_id"] is None
    with tarfile.open(world.store.root / model.object_key) as tar:
        names = tar.getnames()
    assert "unet/config.json" in names and not any(n.startswith("vae") for n in names)
    assert world.api.final.to_state == JobState.SUCCEEDED and world.ledger.calls == []


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
    assert manifest["steps"] == 2 and manifest["guidance_scale"] == 2.0
    assert manifest["batch_size"] == 64 and manifest["images_per_second"] > 0
    assert manifest["guidance_applied"] is True and manifest["per_label"] is False
    assert manifest["layout_source"] is None
    assert manifest["non_dp_evaluations"] == [] and manifest["dp_evaluations"] == []
    assert manifest["selection_caveat"] == SELECTION_CAVEAT  # issue 13, item 6
    assert world.ledger.calls == []
    result = world.api.final.result
    assert result["images"] == 20 and result["images_per_second"] == manifest[
        "images_per_second"]
    assert {k: result[k] for k in ("sampler", "steps", "guidance_scale", "batch_size",
                                   "seed")} == {"sampler": "ddim", "steps": 2,
                                                "guidance_scale": 2.0, "batch_size": 64,
                                                "seed": 7}


def test_generate_passes_sampler_and_batch_size_to_the_sampler(world: World) -> None:
    model_id = world.upload_model()
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id))
    claim = _generate_claim(world, ref, samples_per_class=3, sampler="dpm_solver++",
                            batch_size=2, steps=1, guidance_scale=1.0)
    assert world.run(claim) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert len([n for n in zf.namelist() if n.endswith(".png")]) == 30
    assert manifest["sampler"] == "dpm_solver++" and manifest["batch_size"] == 2
    # batch_size 2 over 3 images per class: batches of 2 then 1 in each class.
    steps = {b.step for b in world.api.heartbeats if b.message == "sampling" and b.total == 30}
    assert steps - {0} == {3 * k + d for k in range(10) for d in (2, 3)}
    assert world.api.final.result["sampler"] == "dpm_solver++"


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


# --- layout-conditioned generation: masks from a PUBLIC dataset only ---------------------

@pytest.fixture(scope="module")
def layout_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny layout-conditioned model over the digit classes (sampling only)."""
    from dpsynth_ml import ModelInfo, PretrainTraining
    from dpsynth_ml.models.architectures import build_bundle, plan_model
    from dpsynth_ml.models.model_io import save_model
    from dpsynth_ml.spec import MODEL_FORMAT_VERSION

    spec = PretrainTraining(preset="tiny", image_size=16, layout_conditioning=True,
                            num_classes=len(CLASS_NAMES))
    plan = plan_model(spec)
    bundle = build_bundle(plan, num_classes=len(CLASS_NAMES))
    info = ModelInfo(format_version=MODEL_FORMAT_VERSION, preset="tiny", image_size=16,
                     channels=1, latent_channels=plan.latent_channels, vae_scaling_factor=1.0,
                     num_classes=len(CLASS_NAMES), class_names=tuple(CLASS_NAMES),
                     null_class=len(CLASS_NAMES), rng="os", training_kind="pretrain", steps=0)
    return save_model(bundle, info, tmp_path_factory.mktemp("layout") / "model")


def _layout_dataset(world: World, *, visibility: str = "public",
                    key: str = "public/datasets/ds_lay/data.npz") -> DatasetInfo:
    """Digits with one stripe mask per image (class 9 has no images: drawn from all)."""
    with np.load(world.digits_npz) as npz:
        images, labels = npz["images"], npz["labels"]
    keep = labels != 9
    masks = np.zeros_like(images[keep])
    for i in range(len(masks)):
        masks[i, i % 8, :] = 255
    path = world.tmp_path / "layouts.npz"
    np.savez(path, images=images[keep], labels=labels[keep], masks=masks,
             class_names=np.array(CLASS_NAMES))
    if not key.startswith("private/"):
        world.store.put_file(key, path)
    return DatasetInfo(dataset_id="ds_lay", visibility=visibility,  # type: ignore[arg-type]
                       object_key=key, class_names=CLASS_NAMES, has_masks=True,
                       declared_public_by="key_owner")


def _layout_claim(world: World, model_dir: Path, dataset: DatasetInfo | None,
                  **spec_extra: Any) -> Claim:
    model_id = world.upload_model(model_dir)
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id))
    source = {"layout_source": {"dataset_id": "ds_lay", "per_class": True}} if dataset else {}
    return _generate_claim(world, ref, samples_per_class=2, layout_dataset=dataset,
                           **source, **spec_extra)


def test_generate_conditions_on_public_layouts_and_records_them(
        world: World, layout_model_dir: Path) -> None:
    claim = _layout_claim(world, layout_model_dir, _layout_dataset(world))
    assert world.run(claim) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert len([n for n in zf.namelist() if n.endswith(".png")]) == 20
    layout = manifest["layout_source"]
    assert layout["dataset_id"] == "ds_lay" and layout["visibility"] == "public"
    assert layout["declared_public_by"] == "key_owner" and layout["per_class"] is True
    assert layout["masks_used"] == 20 and set(layout["indices"]) == set(CLASS_NAMES)
    with np.load(world.digits_npz) as npz:
        labels = npz["labels"][npz["labels"] != 9]
    for name, picks in layout["indices"].items():  # each class drew its own class's masks
        if name != "digit 9":
            assert {CLASS_NAMES[labels[i]] for i in picks} == {name}


def test_generate_refuses_a_private_layout_dataset(world: World,
                                                   layout_model_dir: Path) -> None:
    for dataset in (_layout_dataset(world, visibility="private",
                                    key="private/datasets/ds_lay/data.npz"),
                    _layout_dataset(world, key="private/datasets/ds_lay/data.npz")):
        world.api.transitions.clear()
        claim = _layout_claim(world, layout_model_dir, dataset)
        assert world.run(claim) == Outcome.FAILED
        assert world.api.final.error_code == "private_conditioning_refused"
        assert world.api.of_kind("corpus") == []


def test_a_layout_model_without_layouts_fails_as_invalid_spec(
        world: World, layout_model_dir: Path) -> None:
    assert world.run(_layout_claim(world, layout_model_dir, None)) == Outcome.FAILED
    assert world.api.final.error_code == "invalid_spec"
    assert "layout" in (world.api.final.message or "")


def test_generate_from_a_per_label_bundle_records_that_guidance_does_not_apply(
        world: World, tmp_path: Path) -> None:
    from dpsynth_ml.models.model_io import save_per_label_model

    bundle = save_per_label_model({"digit 1": world.pretrained_dir,
                                   "digit 4": world.pretrained_dir}, tmp_path / "bundle")
    model_id = world.upload_model(bundle)
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id))
    assert world.run(_generate_claim(world, ref, steps=1)) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        pngs = sorted(n for n in zf.namelist() if n.endswith(".png"))
    assert pngs == ["digit_1/0.png", "digit_1/1.png", "digit_4/0.png", "digit_4/1.png"]
    assert manifest["counts"] == {"digit 1": 2, "digit 4": 2}
    assert manifest["per_label"] is True and manifest["guidance_applied"] is False
    assert manifest["guidance_scale"] == 2.0  # as asked, recorded, not applied
