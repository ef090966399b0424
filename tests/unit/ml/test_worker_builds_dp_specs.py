"""The platform can never train without DP: the worker builds every finetune's spec with a
privacy block, no job field reaches a non-private mode, and no product code has one (the
benchmarks' non-private baseline lives in benchmarks/nonprivate_finetune.py)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import dpsynth_ml
import pytest
from dpsynth_ml import DpSpec, FinetuneTraining, InvalidSpecError, RecordLevel, TrainingResult
from dpsynth_shared.job_specs import FinetuneSpec
from dpsynth_shared.worker_contract import DatasetInfo
from dpsynth_worker.runners.training_specs import finetune_training_spec
from pydantic import ValidationError

from tests.unit.worker.fakes import FakeLedger, FakeReservation

from .support import NUM_RECORDS


def test_a_finetune_spec_always_carries_a_privacy_block() -> None:
    """No field of a finetune spec turns DP off: its privacy is one of the DP variants."""
    names = {f.name for f in dataclasses.fields(FinetuneTraining)}
    assert "nonprivate" not in names and "privacy" in names
    with pytest.raises(TypeError):
        FinetuneTraining()  # type: ignore[call-arg]  # the privacy block is required
    with pytest.raises(InvalidSpecError, match="privacy"):
        FinetuneTraining(privacy=None)  # type: ignore[arg-type]


# --- the platform cannot reach it ----------------------------------------------------------

TRAININGS: list[dict[str, Any]] = [
    {},
    {"trainable": "full"},
    {"trainable": "lora", "lora_rank": 2},
    {"trainable": "blocks", "blocks": ["conv_out"], "noise_multiplicity": 2},
    {"class_map": {f"digit {i}": f"digit {i}" for i in range(10)}, "ema_decay": 0.9},
    {"class_conditional": False, "warmup_steps": 3},
]


@pytest.mark.parametrize("training", TRAININGS)
def test_the_worker_builds_a_dp_spec_from_every_finetune_job(
        training: dict[str, Any], pretrained: TrainingResult) -> None:
    """``dpsynth_worker.runners.training_specs.finetune_training_spec`` is the only place the
    worker turns a finetune job into a TrainingSpec: always a FinetuneTraining whose privacy
    is the reservation's DpSpec (or per-label DpSpecs)."""
    ledger = FakeLedger()
    reservation = ledger.add(FakeReservation(
        reservation_id=f"res_{uuid.uuid4().hex}", job_id="job_x", dataset_id="ds_x",
        noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8, planned_steps=12,
        steps_reserved=12))
    spec = FinetuneSpec.model_validate({
        "type": "finetune", "dataset_id": "ds_x", "base_model_id": "mdl_x",
        "privacy": {"target_epsilon": 1.0, "max_grad_norm": 1.0},
        "training": {"expected_batch_size": 8, **training}})
    names = [f"digit {i}" for i in range(10)]
    built = finetune_training_spec(
        spec, reservation=ledger.get_reservation(reservation.reservation_id),
        dataset=DatasetInfo(dataset_id="ds_x", visibility="private", object_key="k",
                            class_names=names, declared_size=NUM_RECORDS, delta=1e-5),
        base=dpsynth_ml.read_model_info(pretrained.model_dir))
    assert isinstance(built, FinetuneTraining)
    # (epsilon, delta): the job's, for the fixed per-step work (dpsynth_ml.dp.padding)
    assert isinstance(built.privacy, RecordLevel)
    assert built.privacy.dp == DpSpec(noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8,
                              max_grad_norm=1.0, steps=12, epsilon=1.0, delta=1e-5)


def test_a_finetune_job_cannot_ask_for_the_nonprivate_mode() -> None:
    """A finetune job always carries a privacy block, and its training block has no field
    (and accepts no unknown key) that could turn the mode on."""
    base = {"type": "finetune", "dataset_id": "ds_x", "base_model_id": "mdl_x"}
    with pytest.raises(ValidationError):
        FinetuneSpec.model_validate(base)
    with pytest.raises(ValidationError):
        FinetuneSpec.model_validate({**base, "privacy": {"target_epsilon": 1.0},
                                     "training": {"nonprivate": True}})
    assert "nonprivate" not in FinetuneSpec.model_json_schema(mode="validation").__repr__()


def test_no_product_code_mentions_the_nonprivate_mode() -> None:
    """Only the benchmarks know the mode: the ML core, the worker (which builds every
    TrainingSpec the platform runs) and the api never name it."""
    import dpsynth_api
    import dpsynth_worker

    for package in (dpsynth_ml, dpsynth_worker, dpsynth_api):
        root = Path(package.__file__).parent
        sources = sorted(root.rglob("*.py"))
        assert sources
        assert [p for p in sources if "nonprivate" in p.read_text()] == []
