"""A finetune with a DP central-image warm-up: calibrated by the ledger before any private
data is read, charged right before the noise is drawn, and the numbers handed to the ML core
verbatim (fake ports, a real local store, the real tiny ML core)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from dpsynth_shared.central_images import central_image_bound
from dpsynth_shared.errors import ErrorCode
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import Claim
from dpsynth_worker.runners import Outcome

from tests.unit.worker.conftest import CLASS_NAMES, World
from tests.unit.worker.fakes import CENTRAL_Z

CENTRAL = {"target_epsilon": 0.5, "downsample": 2, "warmup_steps": 2, "warmup_batch_size": 10}


def _claim(world: World, *, sizes: dict[str, int] | None = None,
           central: dict[str, Any] | None = None) -> Claim:
    claim = world.finetune_claim(steps=2, checkpoint_every=2)
    spec = dict(claim.spec)
    spec["training"] = {**spec["training"], "central_images": central or CENTRAL}
    dataset = claim.dataset
    assert dataset is not None
    class_sizes = sizes if sizes is not None else {name: 10 for name in CLASS_NAMES}
    return claim.model_copy(update={"spec": spec, "dataset": dataset.model_copy(
        update={"class_sizes": class_sizes})})


def test_calibrated_before_the_read_charged_before_the_steps(world: World) -> None:
    claim = _claim(world)
    assert world.run(claim) == Outcome.SUCCEEDED
    names = world.ledger.names()
    central = [kw for name, kw in world.ledger.calls if name == "central_images"]
    assert [c["dry_run"] for c in central] == [True, False]
    first, second = (i for i, n in enumerate(names) if n == "central_images")
    # the calibration precedes the read grant; the charge precedes every DP-SGD lease
    assert first < names.index("read_grant") < second < names.index("lease")
    assert central[1] == {**central[0], "dry_run": False}
    assert central[0]["image_size"] == 16 and central[0]["channels"] == 1
    bound = central_image_bound(16, 1, 2)
    (model,) = world.api.of_kind("model")
    record = model.metadata["central_images"]
    assert record["bound"] == bound and record["noise_std"] == CENTRAL_Z * bound
    assert len(record["release_ids"]) == 1
    assert world.api.final.to_state == JobState.SUCCEEDED


def test_a_refused_charge_fails_the_job_before_any_step(world: World) -> None:
    world.ledger.central_refuses_charge = True
    claim = _claim(world)
    assert world.run(claim) == Outcome.FAILED
    assert "lease" not in world.ledger.names()
    assert world.api.final.error_code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED
    assert world.ledger.reservations[claim.reservation_id or ""].closed == "failed"


def test_an_inadmissible_calibration_fails_before_the_data_is_read(world: World) -> None:
    world.ledger.central_admits = False
    claim = _claim(world)
    assert world.run(claim) == Outcome.FAILED
    assert "read_grant" not in world.ledger.names()
    assert world.api.final.error_code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED


@pytest.mark.parametrize("sizes", [{}, {CLASS_NAMES[0]: 5}])
def test_missing_public_class_sizes_are_refused_before_the_read(world: World,
                                                                sizes: dict[str, int]) -> None:
    claim = _claim(world, sizes=sizes)
    assert world.run(claim) == Outcome.FAILED
    assert "read_grant" not in world.ledger.names()
    assert world.api.final.error_code == ErrorCode.INVALID_SPEC


def test_second_moments_reach_the_ledger_and_the_ml_core(world: World) -> None:
    claim = _claim(world, central={**CENTRAL, "second_moments": True, "components": 3})
    assert world.run(claim) == Outcome.SUCCEEDED
    central = [kw for name, kw in world.ledger.calls if name == "central_images"]
    assert [c["second_moments"] for c in central] == [True, True]
    bound = central_image_bound(16, 1, 2)
    (model,) = world.api.of_kind("model")
    record = model.metadata["central_images"]
    # the ledger's noise for the joint unit norm √2·bound, handed to the ML core verbatim
    assert record["noise_std"] == pytest.approx(CENTRAL_Z * math.sqrt(2.0) * bound, rel=1e-15)
    assert record["second_moments"] is True
