"""Generation conditioned on a layout generator's masks (``layout_source.model_id``), with
fake ports and the real tiny ML core."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dpsynth_shared.worker_contract import Claim, ModelRef
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import corpus_key, model_key, write_provenance

from tests.unit.worker.conftest import CLASS_NAMES, World


def _tiny_model(root: Path, *, layout_conditioning: bool, extra: dict[str, Any],
                rng: str = "os", classes: list[str] = CLASS_NAMES) -> Path:
    """An untrained tiny model over ``classes`` (sampling only)."""
    from dpsynth_ml import ModelInfo, PretrainTraining
    from dpsynth_ml.models.architectures import build_bundle, plan_model
    from dpsynth_ml.models.model_io import save_model
    from dpsynth_ml.spec import MODEL_FORMAT_VERSION

    spec = PretrainTraining(preset="tiny", image_size=16,
                            layout_conditioning=layout_conditioning, num_classes=len(classes))
    plan = plan_model(spec)
    torch.manual_seed(0)
    bundle = build_bundle(plan, num_classes=len(classes))
    info = ModelInfo(format_version=MODEL_FORMAT_VERSION, preset="tiny", image_size=16,
                     channels=1, latent_channels=plan.latent_channels, vae_scaling_factor=1.0,
                     num_classes=len(classes), class_names=tuple(classes),
                     null_class=len(classes), rng=rng, training_kind="pretrain",  # type: ignore[arg-type]
                     steps=0, extra={"layout_channels": plan.layout_channels, **extra})
    return save_model(bundle, info, root / "model")


@pytest.fixture(scope="module")
def image_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_model(tmp_path_factory.mktemp("img"), layout_conditioning=True, extra={})


@pytest.fixture(scope="module")
def mask_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DP layout generator (as a target-masks finetune leaves it, with its provenance)."""
    folder = _tiny_model(tmp_path_factory.mktemp("masks"), layout_conditioning=False,
                         extra={"target": "masks"})
    write_provenance(folder, {"dp": True, "dataset_id": "ds_private", "job_epsilon": 0.75,
                              "job_ids": ["job_masks"]})
    return folder


def _claim(world: World, image_dir: Path, layout_dir: Path, *, dp: bool = True,
           layout_id: str | None = None) -> Claim:
    model_id, mask_id = world.upload_model(image_dir), world.upload_model(layout_dir)
    spec = {"type": "generate", "model_id": model_id, "samples_per_class": 2,
            "sampler": "ddim", "steps": 2, "guidance_scale": 2.0, "seed": 7,
            "layout_source": {"model_id": layout_id or mask_id, "per_class": True}}
    layout = ModelRef(model_id=mask_id, object_key=model_key(mask_id),
                      dataset_id="ds_private" if dp else None, job_ids=["job_masks"], dp=dp)
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="generate",
                 spec=spec, base_model=ModelRef(model_id=model_id, object_key=model_key(model_id)),
                 layout_model=layout, lease_ttl_s=60, heartbeat_s=10)


def test_generate_conditions_on_generated_masks_and_records_the_layout_model(
        world: World, image_model_dir: Path, mask_model_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth_ml
    import dpsynth_ml.sampling.generate as generate_module

    generated: list[Any] = []
    encoded: list[np.ndarray] = []
    # the worker's adapter calls the face's sample_layouts; sample encodes inside the core
    real_sample_layouts, real_encode = dpsynth_ml.sample_layouts, generate_module.encode_layouts

    def spy_sample_layouts(*args: Any, **kwargs: Any) -> Any:
        generated.append(real_sample_layouts(*args, **kwargs))
        return generated[-1]

    def spy_encode(bundle: Any, info: Any, masks: np.ndarray) -> Any:
        encoded.append(masks.copy())
        return real_encode(bundle, info, masks)

    monkeypatch.setattr(dpsynth_ml, "sample_layouts", spy_sample_layouts)
    monkeypatch.setattr(generate_module, "encode_layouts", spy_encode)
    claim = _claim(world, image_model_dir, mask_model_dir)
    assert world.run(claim) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert len([n for n in zf.namelist() if n.endswith(".png")]) == 20
    layout = manifest["layout_source"]
    assert layout["model_id"] == claim.layout_model.model_id  # type: ignore[union-attr]
    assert layout["dp"] is True and layout["job_epsilon"] == 0.75
    assert layout["dataset_id"] == "ds_private" and layout["masks_generated"] == 20
    assert layout["masks_used"] == 20 and set(layout["indices"]) == set(CLASS_NAMES)
    assert "visibility" not in layout  # no dataset's masks were copied

    (layouts,) = generated
    assert set(np.unique(layouts.masks)) <= {0, 255}
    # Every image was conditioned on the generated mask its index names, of its own class.
    conditioned = np.concatenate(encoded)
    picks = [i for name in CLASS_NAMES for i in layout["indices"][name]]
    np.testing.assert_array_equal(conditioned, layouts.masks[picks])
    for name, own in layout["indices"].items():
        assert {layouts.class_names[layouts.labels[i]] for i in own} == {name}


def test_an_image_model_is_not_a_layout_generator(world: World, image_model_dir: Path) -> None:
    plain = _tiny_model(world.tmp_path / "plain", layout_conditioning=False, extra={})
    assert world.run(_claim(world, image_model_dir, plain, dp=False)) == Outcome.FAILED
    assert world.api.final.error_code == "invalid_spec"
    assert "layout generator" in (world.api.final.message or "")
    assert world.api.of_kind("corpus") == []


def test_a_test_rng_layout_generator_is_not_publishable(world: World,
                                                        image_model_dir: Path) -> None:
    masks = _tiny_model(world.tmp_path / "test-rng", layout_conditioning=False,
                        extra={"target": "masks"}, rng="test")
    assert world.run(_claim(world, image_model_dir, masks, dp=False)) == Outcome.FAILED
    assert world.api.final.error_code == "not_publishable"


def test_the_claim_must_match_the_spec(world: World, image_model_dir: Path,
                                       mask_model_dir: Path) -> None:
    claim = _claim(world, image_model_dir, mask_model_dir, layout_id="mdl_other")
    assert world.run(claim) == Outcome.FAILED
    assert world.api.final.error_code == "invalid_spec"


def test_a_masks_finetune_trains_on_the_private_masks_under_the_same_leases(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth_ml.training.finetune.setup as finetune_module

    claim = world.finetune_claim(steps=4, checkpoint_every=2)
    assert claim.dataset is not None
    with np.load(world.digits_npz) as npz:
        arrays = {k: npz[k] for k in npz.files}
    masks = np.zeros_like(arrays["images"])
    masks[:, ::3] = 255
    masked = world.tmp_path / "masked.npz"
    np.savez(masked, masks=masks, **arrays)
    world.store.put_file(claim.dataset.object_key, masked)  # the private dataset, with masks
    spec = {**claim.spec, "training": {**claim.spec["training"], "target": "masks"}}
    claim = claim.model_copy(update={
        "spec": spec, "dataset": claim.dataset.model_copy(update={"has_masks": True})})
    views: list[Any] = []
    real_view = finetune_module.training_view

    def spy_view(dataset: Any, target: str) -> Any:
        views.append(real_view(dataset, target))
        return views[-1]

    monkeypatch.setattr(finetune_module, "training_view", spy_view)
    assert world.run(claim) == Outcome.SUCCEEDED, world.api.transitions
    (view,) = views
    np.testing.assert_array_equal(view.images, masks)  # the records trained on: the masks
    (res,) = world.ledger.reservations.values()
    assert res.steps_granted == 4  # leased and charged like any finetune
    (model,) = world.api.of_kind("model")
    assert model.metadata["target"] == "masks" and model.metadata["dp"] is True
    assert model.metadata["training"]["target"] == "masks"
