"""The audit runner against fake ports, a real local store and the real tiny ML core: it
rebuilds the audited finetune's DP-SGD from its reservation, runs it on a PUBLIC stand-in,
reads nothing private and charges nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
from dpsynth_ml import FinetuneTraining, WhiteBoxAudit
from dpsynth_ml.audit.gdp import GdpAuditBound
from dpsynth_ml.audit.one_run import AuditBound
from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.errors import ErrorCode
from dpsynth_shared.gdp import gdp_epsilon
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import Reservation
from dpsynth_shared.stores.local import LocalDirStore
from dpsynth_shared.worker_contract import AuditTarget, Claim, DatasetInfo
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.runners import Outcome
from prometheus_client import REGISTRY

from tests.unit.worker.conftest import CLASS_NAMES, NUM_RECORDS, World, _hex
from tests.unit.worker.test_per_label_runner import PerLabelLedger, _runs
from tests.unit.worker.test_per_label_runner import _claim as _per_label_claim


def _audit_claim(world: World, *, steps: int = 6, canaries: int = 200,
                 audited: Claim | None = None, **target_extra: Any) -> Claim:
    if audited is None:
        audited = world.finetune_claim(steps=steps, checkpoint_every=steps)
    assert audited.dataset is not None and audited.reservation_id is not None
    # the audited (private) data is gone: an audit that read it would fail
    world.store.delete(audited.dataset.object_key)
    public_id = _hex("ds")
    key = f"public/datasets/{public_id}/data.npz"
    world.store.put_file(key, world.digits_npz)
    target = AuditTarget(job_id=_hex("job"), spec=audited.spec,
                         reservation_id=audited.reservation_id,
                         dataset_id=audited.dataset.dataset_id, class_names=CLASS_NAMES,
                         declared_size=NUM_RECORDS, delta=1e-5, **target_extra)
    spec = {"type": "audit", "job_id": target.job_id, "stand_in_dataset_id": public_id,
            "canaries": canaries, "seed": 3}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="audit", spec=spec,
                 dataset=DatasetInfo(dataset_id=public_id, visibility="public", object_key=key,
                                     class_names=[f"c{i}" for i in range(10)]),
                 base_model=audited.base_model, audit_target=target, lease_ttl_s=60,
                 heartbeat_s=10)


def test_an_audit_runs_the_audited_mechanism_on_the_stand_in(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    claim = _audit_claim(world)
    # the fake ledger's job epsilon is 0.05 a step, not the run's: the claim tested here is
    # the epsilon at delta of the run's GDP envelope (at least the run's own PLD figure)
    fake = world.ledger.get_reservation

    def reservation(reservation_id: str) -> Reservation:
        r = fake(reservation_id)
        assert isinstance(r.event, DpSgdEvent)
        mu = dp_sgd_gdp_envelope(r.event.noise_multiplier, r.event.sample_rate,
                                 r.event.steps).mu
        return r.model_copy(update={"job_epsilon": gdp_epsilon(mu, 1e-5)})

    monkeypatch.setattr(world.ledger, "get_reservation", reservation)
    assert world.run(claim) == Outcome.SUCCEEDED
    # nothing leased, granted, charged or closed: the reservation is only read
    assert set(world.ledger.names()) == {"get_reservation", "gdp_envelope"}
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED
    view = final.result["audit_result"]
    # an honest run is not rejected: a single run may be (at most 5 % of the time at 95 %;
    # the DP noise is OS-keyed, so this is not replayable), its confirming re-run at 99 %
    # too at most 1 % of those: "rejected" at most 5e-4 of the time
    assert view["verdict"] in ("consistent", "cannot_bite", "unconfirmed"), view
    assert view["canaries"] == 200 and view["confidence"] == 0.95 and view["delta"] == 1e-5
    run = view["run"]
    # the reservation's numbers verbatim; N̂ = 8 / 0.16
    assert (run["noise_multiplier"], run["sample_rate"], run["steps"]) == (1.1, 0.16, 6)
    assert run["expected_batch_size"] == 8 and run["population_size"] == 50
    assert run["stand_in_records"] == NUM_RECORDS
    assert 0.0 <= view["epsilon_lower_bound"] <= view["max_certifiable_epsilon"]
    assert view["gdp"]["claimed_mu"] > 0
    assert view["key"]["engine"] in ("BookKeepingEngine", "DpSgdEngine")
    assert view["key"]["device"] == "cpu" and "trainable=" in view["key"]["recipe_family"]
    assert not world.api.artifacts  # the audit's model is not kept


def test_a_subject_level_run_gets_stand_in_subjects_of_the_most_images_one_gives(
        world: World) -> None:
    claim = _audit_claim(world, privacy_unit="subject")
    assert claim.audit_target is not None
    spec = claim.audit_target.spec
    spec["training"]["max_images_per_subject"] = 2
    assert world.run(claim) == Outcome.SUCCEEDED
    view = world.api.final.result["audit_result"]
    run = view["run"]
    assert run["privacy_unit"] == "subject" and run["population_size"] == 50  # subjects
    assert run["stand_in_records"] == NUM_RECORDS  # 25 subjects of 2 images <= N̂ = 50
    assert view["verdict"] in ("consistent", "cannot_bite", "unconfirmed"), view


def test_a_private_stand_in_is_refused(world: World) -> None:
    claim = _audit_claim(world)
    assert claim.dataset is not None
    private = claim.model_copy(update={"dataset": claim.dataset.model_copy(
        update={"visibility": "private"})})
    assert world.run(private) == Outcome.FAILED
    assert world.api.final.error_code == ErrorCode.VISIBILITY_MISMATCH


@pytest.mark.parametrize("classes", [3])
def test_a_stand_in_with_other_classes_is_refused(world: World, classes: int) -> None:
    claim = _audit_claim(world)
    assert claim.audit_target is not None
    fewer = claim.model_copy(update={"audit_target": claim.audit_target.model_copy(
        update={"class_names": CLASS_NAMES[:classes]})})
    assert world.run(fewer) == Outcome.FAILED
    assert world.api.final.error_code == ErrorCode.INVALID_SPEC


@dataclass(frozen=True, kw_only=True)
class AuditorCore(MlAdapter):
    """The real ML core with canned audit results in place of ``audit_finetune``: the
    alarm's logic, whatever the mechanism (the real audits are tested in tests/unit/ml)."""

    rejects: tuple[bool, ...]
    seeds: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)

    def audit_finetune(self, spec: FinetuneTraining, *, dataset_path: Path,
                       base_model_dir: Path, canaries: int, delta: float, seed: int,
                       confidence: float, claimed_mu: float | None,
                       tail_delta: float, audited_class: str | None,
                       devices: str) -> WhiteBoxAudit:
        self.placed.append(devices)
        # placed as dpsynth_ml.audit_placed places a whole-dataset spec: a rank per device
        entries = devices.split(",")
        rejected = self.rejects[len(self.seeds)]
        self.seeds.append(seed)
        self.confidences.append(confidence)
        mu = (claimed_mu or 1.0) * (2.0 if rejected else 0.5)
        bound = AuditBound(epsilon_lower_bound=0.1, confidence=confidence, delta=delta,
                           canaries=canaries, guesses=10, correct=9, guess_in=10, guess_out=0,
                           candidates=12, max_certifiable=5.0)
        gdp = GdpAuditBound(mu_lower_bound=mu, epsilon_lower_bound=0.2, claimed_mu=claimed_mu,
                            rejected=rejected, confidence=confidence, delta=delta,
                            canaries=canaries, guesses=10, correct=9, candidates=7,
                            tail_delta=tail_delta, max_certifiable_mu=10.0)
        return WhiteBoxAudit(bound=bound, gdp=gdp, steps=6, sample_rate=0.16, presences=1,
                             scores=np.zeros(canaries), engine="BookKeepingEngine",
                             device=entries[0], world_size=len(entries))


def _verdicts(engine: str = "BookKeepingEngine") -> dict[str, float]:
    return {v: REGISTRY.get_sample_value("privacy_audit_verdicts_total",
                                         {"verdict": v, "engine": engine}) or 0.0
            for v in ("rejected", "unconfirmed", "consistent", "cannot_bite")}


@pytest.mark.parametrize(("rejects", "verdict"), [((True, True), "rejected"),
                                                   ((True, False), "unconfirmed"),
                                                   ((False,), "consistent")])
def test_a_rejection_is_confirmed_by_a_rerun_before_it_alarms(
        world: World, caplog: pytest.LogCaptureFixture, rejects: tuple[bool, ...],
        verdict: str) -> None:
    core = AuditorCore(rejects=rejects)
    before = _verdicts()
    assert world.run(_audit_claim(world), ml=core) == Outcome.SUCCEEDED
    view = world.api.final.result["audit_result"]
    assert view["verdict"] == verdict
    assert core.seeds == [3, 4][:len(rejects)]  # the re-run draws fresh canaries ...
    assert core.confidences == [0.95, 0.99][:len(rejects)]  # ... and alarms only at 99 %
    assert ("confirmation" in view) == (len(rejects) == 2)
    after = _verdicts()
    assert after[verdict] == before[verdict] + 1
    alarms = [r for r in caplog.records if "PRIVACY AUDIT ALARM" in r.getMessage()]
    assert len(alarms) == (1 if verdict == "rejected" else 0)


@pytest.mark.parametrize(("devices", "kind", "ranks"), [("cuda:1,cuda:2", "cuda", 2),
                                                     ("cpu", "cpu", 1)])
def test_an_audit_is_placed_like_the_workers_finetunes_and_says_so(
        world: World, devices: str, kind: str, ranks: int) -> None:
    """The audit gets the worker's DEVICES setting (a whole-dataset finetune's audit runs
    on its ranks, as the finetune did) and its key names the device kind and the ranks the
    result says it ran on, so a CPU audit is never shown as a GPU one, nor one rank as two."""
    core = AuditorCore(rejects=(False,), devices=devices)
    assert world.run(_audit_claim(world), ml=core) == Outcome.SUCCEEDED
    assert core.placed == [devices]
    key = world.api.final.result["audit_result"]["key"]
    assert (key["device"], key["world_size"]) == (kind, ranks)


@pytest.mark.parametrize(("asked", "audited"), [(None, "digit 3"), ("digit 4", "digit 4")])
def test_a_per_label_finetune_is_audited_on_its_largest_epsilon_class_or_the_one_asked(
        tmp_path: Path, digits_npz: Path, pretrained_dir: Path, asked: str | None,
        audited: str) -> None:
    ledger = PerLabelLedger()
    world = World(tmp_path, LocalDirStore(tmp_path / "objects",
                                          grant_public_key=ledger.public_key),
                  ledger, digits_npz, pretrained_dir)
    runs = _runs({c: 3 + i % 4 for i, c in enumerate(CLASS_NAMES)})  # digits 3, 7: 6 steps
    claim = _audit_claim(world, audited=_per_label_claim(world, ledger, runs))
    if asked is not None:
        claim.spec["audited_class"] = asked
    assert world.run(claim) == Outcome.SUCCEEDED
    assert set(ledger.names()) == {"get_reservation", "gdp_envelope"}
    run = world.api.final.result["audit_result"]["run"]
    # default: the first of the classes with the largest epsilon; else the class asked for
    chosen = runs[audited]
    assert run["audited_class"] == audited and run["steps"] == chosen.planned
    assert (run["noise_multiplier"], run["sample_rate"]) == (chosen.sigma, chosen.q)
    assert run["population_size"] == round(chosen.batch / chosen.q)  # N̂_c
    # the claim tested is that class's epsilon (the job's, for the largest)
    assert world.api.final.result["audit_result"]["claimed_epsilon"] == pytest.approx(
        0.05 * chosen.reserved)
    if asked is None:
        assert chosen.reserved == max(r.reserved for r in runs.values())


def test_a_black_box_audit_puts_loss_canaries_among_the_stand_in_records(world: World) -> None:
    claim = _audit_claim(world, canaries=20)
    claim.spec["mode"] = "black_box"
    assert world.run(claim) == Outcome.SUCCEEDED
    assert set(world.ledger.names()) == {"get_reservation", "gdp_envelope"}
    view = world.api.final.result["audit_result"]
    assert view["mode"] == view["key"]["mode"] == "black_box"
    assert "finished model" in view["method"] and view["canaries"] == 20
    run = view["run"]
    # N̂ = 8 / 0.16 = 50: 30 stand-in records, and the canaries drawn in beside them
    assert run["population_size"] == 50 and run["stand_in_records"] == 30
    assert 0 < run["canaries_included"] < 20 and run["presences"] is None
    assert view["verdict"] in ("consistent", "cannot_bite", "unconfirmed"), view
    assert not world.api.artifacts  # the audit's model is not kept


def test_a_black_box_audit_of_a_subject_level_run_has_canary_subjects(world: World) -> None:
    claim = _audit_claim(world, canaries=20, privacy_unit="subject")
    assert claim.audit_target is not None
    claim.audit_target.spec["training"]["max_images_per_subject"] = 2
    claim.spec["mode"] = "black_box"
    assert world.run(claim) == Outcome.SUCCEEDED
    view = world.api.final.result["audit_result"]
    assert view["mode"] == "black_box" and view["canaries"] == 20
    run = view["run"]
    # N̂ = 50 subjects: the stand-in's 25 subjects of 2 images fit beside the 20 canary
    # subjects (at most N̂ - m = 30), each canary 2 noise images in or out together
    assert run["privacy_unit"] == "subject" and run["population_size"] == 50
    assert run["stand_in_subjects"] == NUM_RECORDS // 2 and run["images_per_canary"] == 2
    assert run["stand_in_records"] == NUM_RECORDS
    assert 0 < run["canaries_included"] < 20
    assert view["verdict"] in ("consistent", "cannot_bite", "unconfirmed"), view
    assert not world.api.artifacts
