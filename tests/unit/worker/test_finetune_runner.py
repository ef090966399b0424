"""The finetune runner against fake ports, a real local store and the real tiny ML core."""

from __future__ import annotations

import json
import logging
import math
import tarfile
import threading

import pytest
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import Heartbeat, HeartbeatReply
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import checkpoint_key, private_stats_key
from prometheus_client import REGISTRY, generate_latest

from tests.unit.worker.conftest import World

PRIVATE_WORDS = ("loss", "grad", "clip", "batch_size")


def _leases(world: World) -> list[tuple[int, int]]:
    return [(kw["start_step"], kw["steps"]) for name, kw in world.ledger.calls if name == "lease"]


def test_claim_refused_runs_nothing(world: World) -> None:
    refused = DpsynthError(ErrorCode.CLAIM_REFUSED, "job is not queued with this attempt")
    outcome = world.run(refused)
    assert outcome == Outcome.REFUSED
    assert world.api.claims == [(world.job_id, 1, "w-test")]
    assert world.api.heartbeats == [] and world.api.artifacts == []
    assert world.api.transitions == [] and world.ledger.calls == []
    assert not world.work_dir.exists() or not any(world.work_dir.iterdir())


def test_finetune_leases_in_chunks_and_publishes_a_dp_model(world: World) -> None:
    claim = world.finetune_claim(steps=12, checkpoint_every=5)
    rid = claim.reservation_id
    assert world.run(claim) == Outcome.SUCCEEDED
    assert _leases(world) == [(0, 5), (5, 5), (10, 2)]
    names = world.ledger.names()
    # the read grant comes before any lease; the close comes last, after job-epsilon
    assert names.index("read_grant") < names.index("lease")
    assert names[-2:] == ["job_epsilon", "close_reservation"]
    assert world.ledger.calls[-1][1] == {"outcome": "succeeded"}
    assert world.ledger.calls[-2][1]["reservation_ids"] == [rid]
    assert [a.checkpoint_step for a in world.api.of_kind("checkpoint")] == [5, 10, 12]
    assert world.store.stat(checkpoint_key(world.job_id, 10)) is not None
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["dp"] is True and meta["steps"] == 12
    assert meta["noise_multiplier"] == 1.1 and meta["sample_rate"] == 0.16
    assert meta["job_epsilon"] == pytest.approx(0.05 * 12) and meta["delta"] == 1e-5
    assert meta["reservation_ids"] == [rid] and meta["rng"] == "os"
    assert len(meta["model_hash"]) == 64
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED and final.result["model_id"] == meta["model_id"]
    assert final.result["job_epsilon"] == pytest.approx(0.6)
    assert world.ledger.reservations[rid].closed == "succeeded"
    # the trainer used the reservation's numbers verbatim
    with tarfile.open(world.store.root / checkpoint_key(world.job_id, 12)) as tar:
        state = json.load(tar.extractfile("trainer_state.json"))  # type: ignore[arg-type]
    assert state["dp"] == {"noise_multiplier": 1.1, "sample_rate": 0.16,
                           "expected_batch_size": 8, "max_grad_norm": 1.0, "steps": 12}
    # every step ran a fixed number of rows sized from public numbers only: N̂ = 8 / 0.16,
    # and the job's (epsilon, delta) bound what the timing channel adds to delta
    assert state["fixed_batch"]["population"] == 50
    assert state["fixed_batch"]["delta_timing"] == pytest.approx(1e-3 * 1e-5)
    assert not (world.work_dir / f"{world.job_id}-attempt-1").exists()


def test_the_padding_cap_is_sized_at_the_dataset_limit(world: World) -> None:
    """A job of ε 1 on a dataset whose limit is 8: the timing channel's δ term must stay at
    1e-3·δ at any figure the dataset can reach, so η is sized at the limit (issue 13, item 5)."""
    claim = world.finetune_claim(steps=3, checkpoint_every=3)
    claim = claim.model_copy(update={"dataset": claim.dataset.model_copy(
        update={"epsilon_limit": 8.0})})
    assert world.run(claim) == Outcome.SUCCEEDED
    with tarfile.open(world.store.root / checkpoint_key(world.job_id, 3)) as tar:
        state = json.load(tar.extractfile("trainer_state.json"))  # type: ignore[arg-type]
    fixed = state["fixed_batch"]
    assert fixed["delta_timing"] == pytest.approx(1e-3 * 1e-5)
    assert fixed["overflow_bound"] == pytest.approx(1e-3 * 1e-5 / (1 + math.exp(8.0)))


def test_private_stats_go_only_to_the_owner_only_artifact(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    claim = world.finetune_claim(steps=4, checkpoint_every=2)
    assert world.run(claim) == Outcome.SUCCEEDED
    (stats,) = world.api.of_kind("private_stats")
    assert stats.owner_only and stats.non_dp
    assert stats.object_key == private_stats_key(world.job_id, 1)
    body = json.loads((world.store.root / stats.object_key).read_text())
    assert [s["step"] for s in body["steps"]] == [0, 1, 2, 3]
    assert all("fraction_clipped" in s for s in body["steps"])
    for other in world.api.artifacts:
        if other is not stats:
            assert not other.owner_only and not other.non_dp
            assert not any(w in json.dumps(other.metadata) for w in ("loss", "clip"))
    for record in caplog.records:
        fields = set(vars(record)) | {record.getMessage()}
        assert not any(w in f for f in fields for w in PRIVATE_WORDS), record.__dict__
    for beat in world.api.heartbeats:
        assert set(beat.model_dump()) == set(Heartbeat.model_fields)
        assert beat.message is None or not any(w in beat.message for w in PRIVATE_WORDS)
    metrics = generate_latest(REGISTRY).decode()
    assert "loss" not in metrics and "clip" not in metrics
    assert [b.epsilon_so_far for b in world.api.heartbeats][-1] == pytest.approx(0.2)


def test_fewer_steps_granted_then_extension_refused_fails_keeping_checkpoint(
        world: World) -> None:
    world.ledger.extend_admits = False
    claim = world.finetune_claim(steps=10, reserved=6, checkpoint_every=5)
    assert world.run(claim) == Outcome.FAILED
    assert _leases(world) == [(0, 5), (5, 5), (6, 4)]  # the second lease granted only 1 step
    extend = [kw for name, kw in world.ledger.calls if name == "extend"]
    assert extend == [{"attempt": 1, "additional_steps": 4}]
    assert [a.checkpoint_step for a in world.api.of_kind("checkpoint")] == [5, 6]
    assert world.api.of_kind("model") == []
    assert world.ledger.calls[-1] == ("close_reservation", {"outcome": "failed"})
    final = world.api.final
    assert final.to_state == JobState.FAILED
    assert final.error_code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED


def test_lease_refused_outright_fails_and_closes(world: World) -> None:
    world.ledger.refuse_leases_with = ErrorCode.PRIVACY_BUDGET_EXHAUSTED
    claim = world.finetune_claim(steps=4)
    assert world.run(claim) == Outcome.FAILED
    assert world.api.of_kind("checkpoint") == [] and world.api.of_kind("model") == []
    assert ("close_reservation", {"outcome": "failed"}) in world.ledger.calls
    assert world.api.final.error_code == "privacy_budget_exhausted"


def test_cancel_from_heartbeat_reply_stops_cancels_and_closes(world: World) -> None:
    def reply(beat: Heartbeat) -> HeartbeatReply:
        cancel = beat.step >= 3
        return HeartbeatReply(cancel_requested=cancel,
                              state="cancelling" if cancel else "running")

    world.api.on_heartbeat = reply
    claim = world.finetune_claim(steps=10, checkpoint_every=5)
    assert world.run(claim) == Outcome.CANCELLED
    steps = [a.checkpoint_step for a in world.api.of_kind("checkpoint")]
    assert steps == [3]  # stopped at the next step boundary, final checkpoint kept
    assert world.ledger.calls[-1] == ("close_reservation", {"outcome": "cancelled"})
    assert world.api.final.to_state == JobState.CANCELLED
    assert world.api.of_kind("model") == []


def test_stale_attempt_stops_without_reporting(world: World) -> None:
    def reply(beat: Heartbeat) -> HeartbeatReply | DpsynthError:
        if beat.step >= 2:
            return DpsynthError(ErrorCode.STALE_ATTEMPT, "attempt 2 is current")
        return HeartbeatReply(cancel_requested=False, state="running")

    world.api.on_heartbeat = reply
    claim = world.finetune_claim(steps=10, checkpoint_every=5)
    assert world.run(claim) == Outcome.ABORTED
    assert world.api.transitions == []
    assert "close_reservation" not in world.ledger.names()


def test_sigterm_interrupts_then_next_attempt_resumes_with_an_extension(world: World) -> None:
    shutdown = threading.Event()

    def reply(beat: Heartbeat) -> HeartbeatReply:
        if beat.step >= 7:
            shutdown.set()
        return HeartbeatReply(cancel_requested=False, state="running")

    world.api.on_heartbeat = reply
    claim = world.finetune_claim(steps=10, checkpoint_every=5)
    rid = claim.reservation_id
    assert world.run(claim, shutdown=shutdown) == Outcome.INTERRUPTED
    assert [a.checkpoint_step for a in world.api.of_kind("checkpoint")] == [5, 7]
    assert "end_lease" in world.ledger.names()
    assert "close_reservation" not in world.ledger.names()  # granted steps stay charged
    assert world.api.final.to_state == JobState.INTERRUPTED
    assert world.api.final.error_code == "worker_shutdown"  # a drain, not a lost attempt
    assert world.ledger.reservations[rid].steps_granted == 10

    # attempt 2 resumes from step 7: steps 7..9 were granted to attempt 1, so they need an
    # extension (fresh noise, new releases) before they run again
    world.api.transitions.clear()
    world.api.on_heartbeat = None
    world.ledger.calls.clear()
    resumed = claim.model_copy(update={"attempt": 2,
                                       "resume_checkpoint_key": checkpoint_key(world.job_id, 7),
                                       "resume_step": 7})
    assert world.run(resumed) == Outcome.SUCCEEDED
    assert _leases(world) == [(7, 3), (7, 3)]
    assert [kw for n, kw in world.ledger.calls if n == "extend"] == [
        {"attempt": 2, "additional_steps": 3}]
    assert world.ledger.reservations[rid].steps_granted == 13
    (model,) = world.api.of_kind("model")
    assert model.metadata["steps"] == 10
    # the dataset is charged all 13 granted steps, but the model's job_epsilon is that of
    # the 10 steps on its own path (steps 7..9 of attempt 1 produced nothing it contains)
    assert model.metadata["job_epsilon"] == pytest.approx(0.05 * 10)
    assert model.metadata["steps_used"] == {rid: 10}
    assert world.api.final.to_state == JobState.SUCCEEDED
    # the device kind and ranks it ran on: its audits are keyed by them (issue 19)
    assert (world.api.final.result["device"], world.api.final.result["world_size"]) == (
        "cpu", 1)


def test_bad_class_map_fails_without_naming_details(world: World) -> None:
    claim = world.finetune_claim(steps=4, class_map={"digit 0": "no such class"})
    assert world.run(claim) == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "invalid_spec"
    assert "withheld" in (final.message or "")
    assert world.ledger.calls[-1] == ("close_reservation", {"outcome": "failed"})
    assert "read_grant" not in world.ledger.names()  # never touched: released in full
    assert "lease" not in world.ledger.names()


def test_unknown_trainable_blocks_fail_before_the_private_data_is_read(world: World) -> None:
    claim = world.finetune_claim(steps=4)
    spec = {**claim.spec, "training": {**claim.spec["training"], "trainable": "blocks",
                                       "blocks": ["up_blocks.9.nothing"]}}
    assert world.run(claim.model_copy(update={"spec": spec})) == Outcome.FAILED
    assert world.api.final.error_code == "invalid_spec"
    assert "read_grant" not in world.ledger.names()  # the reservation is released in full
    assert "lease" not in world.ledger.names()


def test_finetune_on_two_cpu_ranks_leases_checkpoints_and_publishes_like_one(
        world: World) -> None:
    """DPSYNTH_WORKER_DEVICES=cpu,cpu: the runner trains through dpsynth_ml.train_placed on
    two gloo ranks (the real core, a spawned second rank); rank 0 is this process and uses
    the runner's hooks, so the ledger and the api see exactly what one process shows."""
    from dpsynth_worker.ml_adapter import MlAdapter

    claim = world.finetune_claim(steps=6, checkpoint_every=4)
    assert world.run(claim, ml=MlAdapter(devices="cpu,cpu")) == Outcome.SUCCEEDED
    assert _leases(world) == [(0, 4), (4, 2)]
    assert [a.checkpoint_step for a in world.api.of_kind("checkpoint")] == [4, 6]
    (model,) = world.api.of_kind("model")
    assert model.metadata["dp"] is True and model.metadata["steps"] == 6
    assert world.ledger.reservations[claim.reservation_id].closed == "succeeded"
    assert world.api.final.result["world_size"] == 2  # its audits run on two ranks
