"""The finetune runner with a per-label reservation (one run per class).

The trainer is a stand-in that follows the ML core's contract (privacy ``PerLabel``: one
DP-SGD run per class, ``acquire_steps(start, count, partition=class)`` with each class's
steps from 0, ``TrainingResult.steps_by_partition``), so these tests pin the worker's side
alone: the spec is the reservation's per-class figures verbatim, leases and extensions name
their class, the manifest lists every class's σ, q, steps and epsilon. The real ML core
runs per-label jobs in tests/e2e/test_per_label.py.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dpsynth_ml import PerLabel, RecordLevel, TrainingResult
from dpsynth_shared.dp_events import DpSgdEvent, ParallelEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import (
    LabelReservation,
    Lease,
    Reservation,
    ReservationState,
)
from dpsynth_shared.worker_contract import Claim, DatasetInfo, ModelRef
from dpsynth_worker.ports import JobEpsilon
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import model_key

from tests.unit.worker.conftest import CLASS_NAMES, NUM_RECORDS, World
from tests.unit.worker.fakes import EPS_PER_STEP, FakeLedger, TrainerCore

SIZE = 10  # every class declares N̂_c = 10 (the 50 records hold at most 10 of any digit)


@dataclass
class _Run:
    sigma: float
    q: float
    batch: int
    planned: int
    reserved: int
    granted: int = 0


@dataclass
class PerLabelLedger(FakeLedger):
    """The fake ledger, plus per-label reservations with one run per class."""

    runs: dict[str, dict[str, _Run]] = field(default_factory=dict)
    lease_cap: int | None = None

    def add_per_label(self, rid: str, job_id: str, dataset_id: str,
                      runs: dict[str, _Run]) -> None:
        from tests.unit.worker.fakes import FakeReservation

        self.add(FakeReservation(reservation_id=rid, job_id=job_id, dataset_id=dataset_id,
                                 noise_multiplier=1.0, sample_rate=0.1,
                                 expected_batch_size=1, steps_reserved=0))
        self.runs[rid] = runs

    def get_reservation(self, reservation_id: str) -> Reservation:
        if reservation_id not in self.runs:
            return super().get_reservation(reservation_id)
        self.calls.append(("get_reservation", {"reservation_id": reservation_id}))
        runs = self.runs[reservation_id]
        parts = {c: LabelReservation(
            event=DpSgdEvent(noise_multiplier=r.sigma, sample_rate=r.q, steps=r.reserved),
            expected_batch_size=r.batch, class_size=SIZE, steps_planned=r.planned,
            steps_reserved=r.reserved, steps_granted=r.granted,
            job_epsilon=EPS_PER_STEP * r.reserved, job_epsilon_granted=EPS_PER_STEP * r.granted)
            for c, r in runs.items()}
        base = self.reservations[reservation_id]
        return Reservation(
            reservation_id=reservation_id, job_id=base.job_id, dataset_id=base.dataset_id,
            state=ReservationState.CLOSED if base.closed else ReservationState.OPEN,
            event=ParallelEvent(partitions={c: p.event for c, p in parts.items()}),
            expected_batch_size=None, steps_reserved=sum(r.reserved for r in runs.values()),
            steps_granted=sum(r.granted for r in runs.values()), current_attempt=1,
            job_epsilon=max(p.job_epsilon for p in parts.values()),
            job_epsilon_granted=max(p.job_epsilon_granted for p in parts.values()),
            per_label=parts)

    def lease(self, reservation_id: str, *, attempt: int, start_step: int, steps: int,
              partition: str | None = None) -> Lease:
        if reservation_id not in self.runs:
            return super().lease(reservation_id, attempt=attempt, start_step=start_step,
                                 steps=steps, partition=partition)
        self.calls.append(("lease", {"attempt": attempt, "start_step": start_step,
                                     "steps": steps, "partition": partition}))
        runs = self.runs[reservation_id]
        if partition not in runs:
            raise DpsynthError(ErrorCode.INVALID_REQUEST, "a per-label lease names its class")
        run = runs[partition]
        if run.granted + steps > run.reserved:
            raise DpsynthError(ErrorCode.RESERVATION_EXHAUSTED, "class fully granted",
                               partition=partition)
        granted = min(steps, self.lease_cap or steps)
        run.granted += granted
        return Lease(lease_id=f"lse_{uuid.uuid4().hex}", reservation_id=reservation_id,
                     attempt=attempt, start_step=start_step, steps=granted,
                     expires_at=datetime.now(UTC) + timedelta(minutes=1),
                     grant=self._grant(self.reservations[reservation_id], attempt),
                     partition=partition, steps_granted_total=run.granted,
                     job_epsilon_granted=EPS_PER_STEP * max(r.granted for r in runs.values()))

    def extend(self, reservation_id: str, *, attempt: int, additional_steps: int,
               partition: str | None = None) -> Reservation:
        if reservation_id not in self.runs:
            return super().extend(reservation_id, attempt=attempt,
                                  additional_steps=additional_steps, partition=partition)
        self.calls.append(("extend", {"attempt": attempt, "additional_steps": additional_steps,
                                      "partition": partition}))
        self.runs[reservation_id][partition].reserved += additional_steps  # type: ignore[index]
        return self.get_reservation(reservation_id)

    def job_epsilon(self, *, dataset_id: str, reservation_ids: list[str],
                    steps_used: dict[str, Any] | None = None) -> JobEpsilon:
        self.calls.append(("job_epsilon", {"dataset_id": dataset_id,
                                           "reservation_ids": list(reservation_ids),
                                           "steps_used": steps_used}))
        per = {c: EPS_PER_STEP * r.granted for rid in reservation_ids
               for c, r in self.runs.get(rid, {}).items()}
        return JobEpsilon(job_epsilon=max(per.values()), delta=1e-5, per_label=per)


@pytest.fixture()
def ledger() -> PerLabelLedger:
    return PerLabelLedger()


@dataclass
class ContractTrainer:
    """Trains nothing: leases each class's steps as the ML core does, returns a model dir."""

    chunk: int = 3
    specs: list[Any] = field(default_factory=list)

    def __call__(self, spec: Any, *, dataset_path: Path, out_dir: Path, hooks: Any,
                 base_model_dir: Path, resume_from: Path | None = None) -> TrainingResult:
        self.specs.append(spec)
        assert dataset_path.is_file()  # the private data was read with the grant
        done: dict[str, int] = {}
        stopped = False
        for name, level in spec.privacy.per_class.items():
            dp = level.dp
            step = 0
            while step < dp.steps and not stopped:
                got = hooks.acquire_steps(step, min(self.chunk, dp.steps - step),
                                          partition=name)
                if got == 0:
                    stopped = True
                step += got
                hooks.on_progress(sum(done.values()) + step, 0)
            done[name] = step
        model_dir = out_dir / "model"
        shutil.copytree(base_model_dir, model_dir)
        return TrainingResult(steps_completed=sum(done.values()), stopped_early=stopped,
                              model_dir=model_dir, trainable_parameters=1, total_parameters=2,
                              rng="os", steps_by_partition=done)


def _runs(planned: dict[str, int], reserved: dict[str, int] | None = None) -> dict[str, _Run]:
    return {c: _Run(sigma=1.0 + i / 10, q=(4 + i % 3) / SIZE, batch=4 + i % 3, planned=n,
                    reserved=(reserved or planned).get(c, n))
            for i, (c, n) in enumerate(planned.items())}


def _claim(world: World, ledger: PerLabelLedger, runs: dict[str, _Run]) -> Claim:
    dataset_id = f"ds_{uuid.uuid4().hex}"
    key = f"private/datasets/{dataset_id}/data.npz"
    world.store.put_file(key, world.digits_npz)
    rid = f"res_{uuid.uuid4().hex}"
    ledger.add_per_label(rid, world.job_id, dataset_id, runs)
    model_id = world.upload_model()
    spec = {"type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
            "privacy": {"target_epsilon": 1.0, "max_grad_norm": 0.5},
            "training": {"per_label": True, "expected_batch_size": 6, "epochs": 1,
                         "max_physical_batch_size": 8, "learning_rate": 1e-3}}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="finetune",
                 spec=spec, reservation_id=rid,
                 dataset=DatasetInfo(dataset_id=dataset_id, visibility="private",
                                     object_key=key, class_names=CLASS_NAMES,
                                     declared_size=NUM_RECORDS, delta=1e-5,
                                     class_sizes={c: SIZE for c in CLASS_NAMES}),
                 base_model=ModelRef(model_id=model_id, object_key=model_key(model_id)),
                 lease_ttl_s=60, heartbeat_s=10)


def test_per_label_spec_is_the_reservations_runs_verbatim_and_leases_name_the_class(
        world: World, ledger: PerLabelLedger) -> None:
    planned = {c: 3 + i % 4 for i, c in enumerate(CLASS_NAMES)}
    runs = _runs(planned)
    trainer = ContractTrainer(chunk=2)
    claim = _claim(world, ledger, runs)
    assert world.run(claim, ml=TrainerCore(trainer=trainer)) == Outcome.SUCCEEDED
    (spec,) = trainer.specs
    assert isinstance(spec.privacy, PerLabel) and spec.class_map is None
    assert list(spec.privacy.per_class) == sorted(CLASS_NAMES)
    for c, level in spec.privacy.per_class.items():
        assert isinstance(level, RecordLevel)  # the digits are an image-unit dataset
        dp, run = level.dp, runs[c]
        assert (dp.noise_multiplier, dp.sample_rate, dp.expected_batch_size, dp.steps,
                dp.max_grad_norm) == (run.sigma, run.q, run.batch, run.planned, 0.5)
        # the job's (epsilon, delta) size the fixed per-step work (dpsynth_ml.dp.padding)
        assert (dp.epsilon, dp.delta) == (1.0, 1e-5)
    leases = [kw for name, kw in ledger.calls if name == "lease"]
    for c, n in planned.items():
        mine = [(kw["start_step"], kw["steps"]) for kw in leases if kw["partition"] == c]
        assert mine[0][0] == 0 and sum(s for _, s in mine) == n  # per-class steps from 0
    assert all(kw["partition"] in CLASS_NAMES for kw in leases)
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["noise_multiplier"] is None and meta["expected_batch_size"] is None
    assert set(meta["per_label"]) == set(CLASS_NAMES)
    for c, rec in meta["per_label"].items():
        assert (rec["noise_multiplier"], rec["sample_rate"], rec["expected_batch_size"],
                rec["steps"], rec["class_size"]) == (runs[c].sigma, runs[c].q, runs[c].batch,
                                                     planned[c], SIZE)
        assert rec["job_epsilon"] == pytest.approx(EPS_PER_STEP * planned[c])
    assert meta["job_epsilon"] == pytest.approx(EPS_PER_STEP * max(planned.values()))
    assert meta["steps"] == sum(planned.values())
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED
    assert final.result["job_epsilon"] == meta["job_epsilon"]
    assert ledger.calls[-1] == ("close_reservation", {"outcome": "succeeded"})


def test_a_class_short_of_steps_is_extended_for_that_class_alone(
        world: World, ledger: PerLabelLedger) -> None:
    planned = {c: 4 for c in CLASS_NAMES}
    short = CLASS_NAMES[3]
    runs = _runs(planned, reserved={short: 2})  # e.g. a replay used part of class 3's steps
    trainer = ContractTrainer(chunk=4)
    assert world.run(_claim(world, ledger, runs), ml=TrainerCore(trainer=trainer)) \
        == Outcome.SUCCEEDED
    extends = [kw for name, kw in ledger.calls if name == "extend"]
    assert extends == [{"attempt": 1, "additional_steps": 2, "partition": short}]
    assert runs[short].granted == 4 and runs[short].reserved == 4


def test_a_per_label_reservation_without_per_label_training_is_refused(
        world: World, ledger: PerLabelLedger) -> None:
    claim = _claim(world, ledger, _runs({c: 2 for c in CLASS_NAMES}))
    claim.spec["training"]["per_label"] = False
    trainer = ContractTrainer()
    assert world.run(claim, ml=TrainerCore(trainer=trainer)) == Outcome.FAILED
    assert trainer.specs == [] and "lease" not in ledger.names()
    assert "read_grant" not in ledger.names()  # refused before the private data is read
    assert world.api.final.error_code == "invalid_spec"
