"""A model fine-tuned from a DP ancestor on the same budget (issue 13, item 8).

Its ``job_epsilon`` is a PLD composition of runs chosen one after another (adaptively): the
model's record, its job result and every corpus manifest sampled from it label that figure
as not a guarantee and show the RDP filter's ``dataset_epsilon_spent`` beside it. Before the
fix the figure stood unlabelled and alone.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from dpsynth_shared.ledger_contract import LINEAGE_LABEL
from dpsynth_shared.worker_contract import Claim, ModelRef
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import corpus_key, model_key, write_provenance

from tests.unit.worker.conftest import World
from tests.unit.worker.fakes import FakeReservation
from tests.unit.worker.test_pretrain_generate_runners import _generate_claim


def _with_dp_ancestor(world: World, tmp_path: Path) -> Claim:
    """A finetune claim whose base model was DP-trained (8 steps) on the same dataset."""
    claim = world.finetune_claim(steps=6, checkpoint_every=6)
    assert claim.dataset is not None and claim.base_model is not None
    dataset_id = claim.dataset.dataset_id
    ancestor = world.ledger.add(FakeReservation(
        reservation_id="res_ancestor", job_id="job_ancestor", dataset_id=dataset_id,
        noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8, steps_reserved=8,
        steps_granted=8))
    folder = tmp_path / "dp-base"
    shutil.copytree(world.pretrained_dir, folder)
    write_provenance(folder, {"dp": True, "dataset_id": dataset_id, "job_epsilon": 0.4,
                              "job_ids": ["job_ancestor"],
                              "reservation_ids": [ancestor.reservation_id],
                              "steps_used": {ancestor.reservation_id: 8}})
    base_id = world.upload_model(folder)
    base = ModelRef(model_id=base_id, object_key=model_key(base_id), dataset_id=dataset_id,
                    job_ids=["job_ancestor"], dp=True)
    return claim.model_copy(update={"base_model": base})


def test_a_finetune_of_a_dp_ancestor_labels_its_job_epsilon(world: World,
                                                             tmp_path: Path) -> None:
    claim = _with_dp_ancestor(world, tmp_path)
    assert world.run(claim) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["reservation_ids"] == ["res_ancestor", claim.reservation_id]
    assert meta["job_epsilon"] == pytest.approx(0.05 * (8 + 6))  # the composed PLD figure
    assert meta["job_epsilon_label"] == LINEAGE_LABEL
    assert "not a guarantee under adaptive use" in meta["job_epsilon_label"]
    assert meta["dataset_epsilon_spent"] == 2.5  # the filter figure beside it
    result = world.api.final.result
    assert result["job_epsilon_label"] == LINEAGE_LABEL
    assert result["dataset_epsilon_spent"] == 2.5
    # the budget view is read once every step is granted, before the job's epsilon
    names = world.ledger.names()
    assert names.index("budget_view") > max(i for i, n in enumerate(names) if n == "lease")


def test_a_finetune_without_dp_ancestor_is_not_labelled(world: World) -> None:
    assert world.run(world.finetune_claim(steps=4, checkpoint_every=4)) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    assert model.metadata["job_epsilon_label"] is None
    assert model.metadata["dataset_epsilon_spent"] == 2.5


def test_the_manifest_of_a_lineage_model_labels_job_epsilon(world: World,
                                                             tmp_path: Path) -> None:
    folder = tmp_path / "dp-model"
    shutil.copytree(world.pretrained_dir, folder)
    write_provenance(folder, {"dp": True, "dataset_id": "ds_priv", "job_epsilon": 1.3,
                              "job_ids": ["job_a", "job_b"],
                              "reservation_ids": ["res_a", "res_b"]})
    model_id = world.upload_model(folder)
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id), dataset_id="ds_priv",
                   job_ids=["job_a", "job_b"], dp=True)
    assert world.run(_generate_claim(world, ref, samples_per_class=1)) == Outcome.SUCCEEDED
    with zipfile.ZipFile(world.store.root / corpus_key(world.job_id)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["job_epsilon"] == 1.3
    assert manifest["job_epsilon_label"] == LINEAGE_LABEL
    assert manifest["dataset_epsilon_spent"] == 2.5
