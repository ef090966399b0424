"""The dp_train runner (issue 20) against fake ports, a real local store and the real ML
core: the reservation's numbers verbatim, a read grant before any lease, steps leased in
chunks, checkpoints a later attempt resumes from, a classifier model published with its
job epsilon, and the reservation closed."""

from __future__ import annotations

import json
import tarfile
import threading
from typing import Any

import pytest
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import Claim, DatasetInfo, Heartbeat, HeartbeatReply
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import checkpoint_key

from tests.unit.worker.conftest import CLASS_NAMES, NUM_RECORDS, World, _hex
from tests.unit.worker.fakes import FakeReservation


def _claim(world: World, *, steps: int = 5, checkpoint_every: int = 2, attempt: int = 1,
           **extra: Any) -> Claim:
    dataset_id = _hex("ds")
    key = f"private/datasets/{dataset_id}/data.npz"
    world.store.put_file(key, world.digits_npz)
    res = world.ledger.add(FakeReservation(
        reservation_id=_hex("res"), job_id=world.job_id, dataset_id=dataset_id,
        noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8, planned_steps=steps,
        steps_reserved=steps))
    spec = {"type": "dp_train", "dataset_id": dataset_id,
            "privacy": {"target_epsilon": 1.0, "max_grad_norm": 1.0},
            "training": {"architecture": "cnn", "image_size": 16, "expected_batch_size": 8,
                         "max_physical_batch_size": 16, "checkpoint_every": checkpoint_every}}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=attempt, type="dp_train",
                 spec=spec, reservation_id=res.reservation_id,
                 dataset=DatasetInfo(dataset_id=dataset_id, visibility="private",
                                     object_key=key, class_names=CLASS_NAMES,
                                     declared_size=NUM_RECORDS, delta=1e-5),
                 lease_ttl_s=60, heartbeat_s=10, **extra)


def _leases(world: World) -> list[tuple[int, int]]:
    return [(kw["start_step"], kw["steps"]) for name, kw in world.ledger.calls if name == "lease"]


def test_dp_train_leases_in_chunks_and_publishes_a_dp_classifier(world: World) -> None:
    claim = _claim(world)
    rid = claim.reservation_id
    assert world.run(claim) == Outcome.SUCCEEDED
    assert _leases(world) == [(0, 2), (2, 2), (4, 1)]
    names = world.ledger.names()
    assert names.index("read_grant") < names.index("lease")
    assert names[-2:] == ["job_epsilon", "close_reservation"]
    assert [a.checkpoint_step for a in world.api.of_kind("checkpoint")] == [2, 4, 5]
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["dp"] is True and meta["model_kind"] == "classifier" and meta["steps"] == 5
    assert meta["training_kind"] == "dp_train" and meta["architecture"] == "cnn"
    assert meta["noise_multiplier"] == 1.1 and meta["sample_rate"] == 0.16
    assert meta["job_epsilon"] == pytest.approx(0.05 * 5) and meta["rng"] == "os"
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED and final.result["model_id"] == meta["model_id"]
    assert (final.result["device"], final.result["world_size"]) == ("cpu", 1)
    assert world.ledger.reservations[rid].closed == "succeeded"
    # the classifier used the reservation's numbers verbatim
    with tarfile.open(world.store.root / checkpoint_key(world.job_id, 4)) as tar:
        info = json.load(tar.extractfile("dpsynth_classifier.json"))  # type: ignore[arg-type]
    assert info["dp"] == {"noise_multiplier": 1.1, "sample_rate": 0.16,
                          "expected_batch_size": 8, "max_grad_norm": 1.0, "steps": 5}
    assert info["fixed_batch"]["population"] == 50  # N̂ = 8 / 0.16


def test_a_drained_attempt_checkpoints_and_the_next_resumes_there(world: World) -> None:
    shutdown = threading.Event()

    def reply(beat: Heartbeat) -> HeartbeatReply:
        if beat.step >= 3:
            shutdown.set()
        return HeartbeatReply(cancel_requested=False, state="running")

    world.api.on_heartbeat = reply
    claim = _claim(world, steps=6, checkpoint_every=2)
    assert world.run(claim, shutdown=shutdown) == Outcome.INTERRUPTED
    stopped_at = [a.checkpoint_step for a in world.api.of_kind("checkpoint")][-1]
    assert stopped_at >= 3 and "close_reservation" not in world.ledger.names()
    world.api.transitions.clear()
    world.api.on_heartbeat = None
    world.ledger.calls.clear()
    resumed = claim.model_copy(update={
        "attempt": 2, "resume_checkpoint_key": checkpoint_key(world.job_id, stopped_at),
        "resume_step": stopped_at})
    assert world.run(resumed) == Outcome.SUCCEEDED
    assert _leases(world)[0][0] == stopped_at
    model = world.api.of_kind("model")[-1]
    assert model.metadata["steps"] == 6
    assert model.metadata["steps_used"] == {claim.reservation_id: 6}
