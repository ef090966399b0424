"""In-memory fakes of the worker's ports (ApiPort, LedgerPort): record calls, answer like
the real services, raise the same domain errors. No mocks. For the ML port (MlPort): the
real adapter with one call replaced by a test's stand-in (:class:`TrainerCore`,
:class:`MetricsCore`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth_shared.central_images import central_image_bound, central_image_unit_norm
from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent
from dpsynth_shared.errors import BudgetExhausted, DpsynthError, ErrorCode
from dpsynth_shared.grants import GrantClaims, generate_signing_key, public_key_of, sign_grant
from dpsynth_shared.ledger_contract import (
    BudgetView,
    GdpEnvelope,
    Lease,
    Plan,
    ReadGrant,
    Reservation,
    ReservationState,
)
from dpsynth_shared.release_contract import CentralImagesRelease, CentralImagesRequest
from dpsynth_shared.worker_contract import (
    Claim,
    Heartbeat,
    HeartbeatReply,
    ProposeTransition,
    RegisterArtifact,
    RegisteredArtifact,
)
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.ml_port import Images, Labels, Progress
from dpsynth_worker.ports import CloseOutcome, JobEpsilon

if TYPE_CHECKING:
    from dpsynth_ml import (
        EvaluationResult,
        ImageDataset,
        TrainingHooks,
        TrainingResult,
        TrainingSpec,
    )

EPS_PER_STEP = 0.05
CENTRAL_Z = 4.0
"""The fake ledger's noise multiplier of a central-image release (σ = z·bound)."""


@dataclass
class FakeReservation:
    reservation_id: str
    job_id: str
    dataset_id: str
    noise_multiplier: float
    sample_rate: float
    expected_batch_size: int
    steps_reserved: int
    planned_steps: int = 0
    steps_granted: int = 0
    closed: str | None = None


@dataclass
class FakeLedger:
    """Grants leases within reservations; ``max_lease_steps`` caps a lease, ``extend_admits``
    says whether the filter admits an extension."""

    signing_key: str = field(default_factory=generate_signing_key)
    reservations: dict[str, FakeReservation] = field(default_factory=dict)
    max_lease_steps: int | None = None
    extend_admits: bool = True
    refuse_leases_with: ErrorCode | None = None
    central_admits: bool = True
    central_refuses_charge: bool = False
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def public_key(self) -> str:
        return public_key_of(self.signing_key)

    def add(self, res: FakeReservation) -> FakeReservation:
        self.reservations[res.reservation_id] = res
        return res

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _grant(self, res: FakeReservation, attempt: int) -> ReadGrant:
        expires = time.time() + 600
        claims = GrantClaims(grant_id=f"grt_{uuid.uuid4().hex}", dataset_id=res.dataset_id,
                             reservation_id=res.reservation_id, job_id=res.job_id,
                             attempt=attempt, expires_at=expires)
        return ReadGrant(token=sign_grant(claims, self.signing_key), dataset_id=res.dataset_id,
                         reservation_id=res.reservation_id, attempt=attempt,
                         expires_at=datetime.fromtimestamp(expires, UTC))

    def get_reservation(self, reservation_id: str) -> Reservation:
        self.calls.append(("get_reservation", {"reservation_id": reservation_id}))
        r = self.reservations[reservation_id]
        event = DpSgdEvent(noise_multiplier=r.noise_multiplier, sample_rate=r.sample_rate,
                           steps=r.steps_reserved)
        planned = event.model_copy(update={"steps": r.planned_steps or r.steps_reserved})
        plan = Plan(dataset_id=r.dataset_id, event=planned,
                    expected_batch_size=r.expected_batch_size,
                    job_epsilon=EPS_PER_STEP * planned.steps, delta=1e-5, admission_order=12,
                    rdp_per_step=0.01, rdp_total=0.01 * planned.steps,
                    dataset_epsilon_spent_before=0.0, dataset_epsilon_spent_after=1.0,
                    dataset_tight_epsilon_after=0.8, admissible=True,
                    max_admissible_target_epsilon=5.0, accountant="rdp-filter+pld")
        return Reservation(reservation_id=r.reservation_id, job_id=r.job_id,
                           dataset_id=r.dataset_id,
                           state=ReservationState.CLOSED if r.closed else ReservationState.OPEN,
                           event=event, expected_batch_size=r.expected_batch_size,
                           steps_reserved=r.steps_reserved, steps_granted=r.steps_granted,
                           current_attempt=1, job_epsilon=EPS_PER_STEP * r.steps_reserved,
                           job_epsilon_granted=EPS_PER_STEP * r.steps_granted, plan=plan)

    def central_images_release(self, reservation_id: str,
                               request: CentralImagesRequest) -> CentralImagesRelease:
        """Calibrate (dry run) or charge a central-image release: σ = CENTRAL_Z·unit norm; a
        charge the filter refuses raises 409 like the ledger."""
        self.calls.append(("central_images", request.model_dump(mode="json")))
        r = self.reservations[reservation_id]
        bound = central_image_bound(request.image_size, request.channels, request.downsample)
        unit = central_image_unit_norm(bound, request.second_moments)
        if not request.dry_run and self.central_refuses_charge:
            raise BudgetExhausted("the filter refuses the central-image release",
                                  max_admissible_target_epsilon=None)
        return CentralImagesRelease(
            release_id=None if request.dry_run else f"rel_{uuid.uuid4().hex}",
            reservation_id=reservation_id, dataset_id=r.dataset_id, job_id=r.job_id,
            event=GaussianEvent(sigma=CENTRAL_Z * unit, sensitivity=unit), bound=bound,
            second_moments=request.second_moments,
            noise_std=CENTRAL_Z * unit, target_epsilon=request.target_epsilon,
            epsilon=request.target_epsilon, delta=1e-5, admission_order=12, rdp_charge=0.5,
            partitions=["*"], dataset_epsilon_spent_before=0.0,
            dataset_epsilon_spent_after=1.0, admissible=self.central_admits,
            charged=not request.dry_run, accountant="rdp-filter+pld")

    def read_grant(self, reservation_id: str, *, attempt: int, worker_id: str) -> ReadGrant:
        self.calls.append(("read_grant", {"attempt": attempt, "worker_id": worker_id}))
        return self._grant(self.reservations[reservation_id], attempt)

    def lease(self, reservation_id: str, *, attempt: int, start_step: int, steps: int,
              partition: str | None = None) -> Lease:
        assert partition is None, "a whole-dataset reservation takes no partition"
        self.calls.append(("lease", {"attempt": attempt, "start_step": start_step,
                                     "steps": steps}))
        if self.refuse_leases_with is not None:
            raise DpsynthError(self.refuse_leases_with, "refused by the test")
        r = self.reservations[reservation_id]
        left = r.steps_reserved - r.steps_granted
        if left <= 0:
            raise DpsynthError(ErrorCode.RESERVATION_EXHAUSTED, "reservation fully granted")
        granted = min(steps, left, self.max_lease_steps or steps)
        r.steps_granted += granted
        return Lease(lease_id=f"lse_{uuid.uuid4().hex}", reservation_id=reservation_id,
                     attempt=attempt, start_step=start_step, steps=granted,
                     expires_at=datetime.now(UTC) + timedelta(minutes=1),
                     grant=self._grant(r, attempt), steps_granted_total=r.steps_granted,
                     job_epsilon_granted=EPS_PER_STEP * r.steps_granted)

    def end_lease(self, reservation_id: str, lease_id: str) -> None:
        self.calls.append(("end_lease", {"lease_id": lease_id}))

    def extend(self, reservation_id: str, *, attempt: int, additional_steps: int,
               partition: str | None = None) -> Reservation:
        assert partition is None, "a whole-dataset reservation takes no partition"
        self.calls.append(("extend", {"attempt": attempt, "additional_steps": additional_steps}))
        if not self.extend_admits:
            raise BudgetExhausted("the filter refuses the extension",
                                  max_admissible_target_epsilon=None)
        self.reservations[reservation_id].steps_reserved += additional_steps
        return self.get_reservation(reservation_id)

    def close_reservation(self, reservation_id: str, *, outcome: CloseOutcome) -> None:
        self.calls.append(("close_reservation", {"outcome": outcome}))
        self.reservations[reservation_id].closed = outcome

    def job_epsilon(self, *, dataset_id: str, reservation_ids: list[str],
                    steps_used: dict[str, Any] | None = None) -> JobEpsilon:
        self.calls.append(("job_epsilon", {"dataset_id": dataset_id,
                                           "reservation_ids": list(reservation_ids),
                                           "steps_used": steps_used}))
        used = steps_used or {}
        steps = sum(used[r] if isinstance(used.get(r), int)
                    else self.reservations[r].steps_granted for r in reservation_ids)
        return JobEpsilon(job_epsilon=EPS_PER_STEP * steps, delta=1e-5)

    def gdp_envelope(self, *, noise_multiplier: float, sample_rate: float,
                     steps: int) -> GdpEnvelope:
        """The ledger's own computation (tests may import the ledger; the worker may not),
        answered like ``POST /v1/gdp-envelopes``."""
        from dpsynth_ledger.accounting.gdp_envelope import dp_sgd_gdp_envelope
        from dpsynth_ledger.service.gdp_envelopes import ACCOUNTANT

        self.calls.append(("gdp_envelope", {"noise_multiplier": noise_multiplier,
                                            "sample_rate": sample_rate, "steps": steps}))
        envelope = dp_sgd_gdp_envelope(noise_multiplier, sample_rate, steps)
        return GdpEnvelope(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                           steps=steps, mu=envelope.mu, tail_delta=envelope.tail_delta,
                           accountant=ACCOUNTANT)

    def budget_view(self, dataset_id: str) -> BudgetView:
        self.calls.append(("budget_view", {"dataset_id": dataset_id}))
        return BudgetView(dataset_id=dataset_id, tenant_id="ten_x", epsilon_limit=10.0,
                          delta=1e-5, neighbouring="add_remove", declared_size=50,
                          admission_order=12, accountant="rdp-filter+pld", rdp_budget=3.0,
                          rdp_spent=1.0, rdp_reserved=0.0, dataset_epsilon_spent=2.5,
                          dataset_epsilon_reserved=0.0, dataset_epsilon_remaining=7.5,
                          dataset_tight_epsilon=1.7)


@dataclass
class FakeApi:
    """Answers claims with ``claim_result``; ``on_heartbeat`` decides heartbeat replies."""

    claim_result: Claim | DpsynthError
    on_heartbeat: Callable[[Heartbeat], HeartbeatReply | DpsynthError] | None = None
    claims: list[tuple[str, int, str]] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    artifacts: list[RegisterArtifact] = field(default_factory=list)
    transitions: list[ProposeTransition] = field(default_factory=list)

    def claim(self, job_id: str, *, attempt: int, worker_id: str) -> Claim:
        self.claims.append((job_id, attempt, worker_id))
        if isinstance(self.claim_result, DpsynthError):
            raise self.claim_result
        return self.claim_result

    def heartbeat(self, job_id: str, beat: Heartbeat) -> HeartbeatReply:
        self.heartbeats.append(beat)
        reply = (self.on_heartbeat(beat) if self.on_heartbeat
                 else HeartbeatReply(cancel_requested=False, state="running"))
        if isinstance(reply, DpsynthError):
            raise reply
        return reply

    def register_artifact(self, job_id: str, artifact: RegisterArtifact) -> RegisteredArtifact:
        self.artifacts.append(artifact)
        model_id = artifact.metadata.get("model_id") if artifact.kind == "model" else None
        return RegisteredArtifact(artifact_id=f"art_{uuid.uuid4().hex}", model_id=model_id)

    def propose_transition(self, job_id: str, proposal: ProposeTransition) -> None:
        self.transitions.append(proposal)

    def of_kind(self, kind: str) -> list[RegisterArtifact]:
        return [a for a in self.artifacts if a.kind == kind]

    @property
    def final(self) -> ProposeTransition:
        assert len(self.transitions) == 1, self.transitions
        return self.transitions[0]


@dataclass(frozen=True, kw_only=True)
class TrainerCore(MlAdapter):
    """The real ML core with a test's ``trainer`` in place of ``train`` (an MlPort: each
    override keeps the adapter's signature)."""

    trainer: Callable[..., TrainingResult]

    def train(self, spec: TrainingSpec, *, dataset_path: Path, out_dir: Path,
              hooks: TrainingHooks, base_model_dir: Path | None = None,
              resume_from: Path | None = None) -> TrainingResult:
        return self.trainer(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                            base_model_dir=base_model_dir, resume_from=resume_from)


@dataclass(frozen=True, kw_only=True)
class MetricsCore(MlAdapter):
    """The real ML core with a test's ``metrics`` in place of ``evaluate_corpus``."""

    metrics: Callable[..., EvaluationResult]

    def evaluate_corpus(self, synthetic: ImageDataset, real_train: ImageDataset,
                        real_holdout: ImageDataset, *, classifiers: Sequence[str],
                        feature_net_dir: Path | None,
                        feature_check: tuple[Images, Labels] | None,
                        min_feature_accuracy: float, prdc_k: int, max_images: int, seed: int,
                        inception_weights: Path | None,
                        progress: Progress | None, device: str = "cpu") -> EvaluationResult:
        # the device is the runner's business (tests/unit/worker/test_worker_devices.py)
        return self.metrics(synthetic, real_train, real_holdout, classifiers=classifiers,
                            feature_net_dir=feature_net_dir, feature_check=feature_check,
                            min_feature_accuracy=min_feature_accuracy, prdc_k=prdc_k,
                            max_images=max_images, seed=seed,
                            inception_weights=inception_weights, progress=progress)
