"""In-memory fakes of the api's ports, for tests (fakes, not mocks: cosmicpython).

:class:`FakeLedger` is a simple *additive* budget: a job's epsilon is its target_epsilon and
the dataset's spent figure is the sum over committed and open reservations. It is faithful
to the ledger's contract (same bodies, same errors and numbers), not to its accountant.
"""

from __future__ import annotations

import math
import threading
import uuid
from dataclasses import dataclass, field
from typing import Literal

from dpsynth_shared.dp_events import GENESIS_HASH, DpSgdEvent, GaussianEvent, ParallelEvent
from dpsynth_shared.errors import (
    BudgetExhausted,
    DpsynthError,
    ErrorCode,
    NotFound,
    budget_refusal,
)
from dpsynth_shared.ids import new_id, new_reservation_id
from dpsynth_shared.ledger_contract import (
    AnchorStatus,
    BudgetView,
    ChainKey,
    CreateBudget,
    LabelPlan,
    LabelReservation,
    LedgerEntry,
    LimitUpdate,
    Plan,
    RecomputeReport,
    ReconcileReport,
    ReconcileRequest,
    Reservation,
    ReservationState,
    ReserveRequest,
    VerifyReport,
)
from dpsynth_shared.release_contract import (
    CentralImagesCharge,
    Evaluation,
    EvaluationRequest,
    HistogramRelease,
    HistogramRequest,
    SetClassSizes,
    SizeReleasePlan,
    SizeReleasePlanRequest,
)


@dataclass
class _FakeReservation:
    reservation: Reservation
    epsilon: float
    outcome: str | None = None


@dataclass
class FakeLedger:
    """An in-memory ledger: budgets, additive admission, reservations, closes."""

    budgets: dict[str, CreateBudget] = field(default_factory=dict)
    reservations: dict[str, _FakeReservation] = field(default_factory=dict)
    closed: list[tuple[str, str]] = field(default_factory=list)
    releases: dict[str, list[HistogramRelease]] = field(default_factory=dict)
    fail_create: bool = False
    reconciled: list[ReconcileRequest] = field(default_factory=list)
    is_ready: bool = True
    evaluations_made: list[Evaluation] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def create_budget(self, request: CreateBudget) -> BudgetView:
        """Register a dataset's budget (raises ``ledger_unavailable`` when told to fail)."""
        if self.fail_create:
            raise DpsynthError(ErrorCode.LEDGER_UNAVAILABLE, "fake ledger told to fail")
        with self._lock:
            if request.dataset_id in self.budgets:
                raise DpsynthError(ErrorCode.CONFLICT, "budget exists")
            if request.size_release is not None:  # N̂ as a DP count: the first charge
                eps = request.size_release.target_epsilon
                if eps > request.epsilon_limit:
                    raise BudgetExhausted("the DP count exceeds the limit",
                                          epsilon_limit=request.epsilon_limit)
                self.releases.setdefault(request.dataset_id, []).append(HistogramRelease(
                    release_id=request.size_release.release_id,
                    dataset_id=request.dataset_id, event=GaussianEvent(
                        sigma=request.size_release.sigma, sensitivity=1.0),
                    target_epsilon=eps, epsilon=eps, delta=request.delta, admission_order=8,
                    rdp_charge=eps, partitions=["*", *request.partitions],
                    dataset_epsilon_spent_before=0.0, dataset_epsilon_spent_after=eps,
                    dataset_epsilon_remaining_after=request.epsilon_limit - eps,
                    admissible=True, charged=True, accountant="fake-additive"))
            self.budgets[request.dataset_id] = request
        return self.get_budget(request.dataset_id)

    def plan_size_release(self, request: SizeReleasePlanRequest) -> SizeReleasePlan:
        """σ of the classic Gaussian mechanism for the target; epsilon = the target."""
        eps = request.target_epsilon
        return SizeReleasePlan(
            event=GaussianEvent(sigma=math.sqrt(2 * math.log(1.25 / request.delta)) / eps,
                                sensitivity=1.0),
            target_epsilon=eps, epsilon=eps, delta=request.delta, admission_order=8,
            rdp_charge=eps, rdp_budget=request.epsilon_limit,
            admissible=eps <= request.epsilon_limit, dataset_epsilon_spent_after=eps,
            accountant="fake-additive")

    def _spent(self, dataset_id: str) -> float:
        return sum(r.epsilon for r in self.reservations.values()
                   if r.reservation.dataset_id == dataset_id and r.outcome != "released") \
            + sum(r.epsilon for r in self.releases.get(dataset_id, []))

    def get_budget(self, dataset_id: str) -> BudgetView:
        """The additive budget view of a dataset."""
        budget = self.budgets.get(dataset_id)
        if budget is None:
            raise NotFound("budget", dataset_id)
        spent = self._spent(dataset_id)
        return BudgetView(
            dataset_id=dataset_id, tenant_id=budget.tenant_id,
            epsilon_limit=budget.epsilon_limit, delta=budget.delta,
            neighbouring=budget.neighbouring, declared_size=budget.declared_size,
            admission_order=8, accountant="fake-additive", rdp_budget=budget.epsilon_limit,
            rdp_spent=spent, rdp_reserved=0.0, dataset_epsilon_spent=spent,
            dataset_epsilon_reserved=0.0,
            dataset_epsilon_remaining=max(0.0, budget.epsilon_limit - spent),
            dataset_tight_epsilon=spent, partitions={p: spent for p in budget.partitions},
            class_sizes=budget.class_sizes, warning_fraction=budget.warning_fraction,
        )

    def plan(self, request: ReserveRequest) -> Plan:
        """The plan of a job: job_epsilon = target_epsilon; admissible iff it fits."""
        budget = self.budgets.get(request.dataset_id)
        if budget is None:
            raise NotFound("budget", request.dataset_id)
        spent = self._spent(request.dataset_id)
        remaining = budget.epsilon_limit - spent
        event: DpSgdEvent | ParallelEvent
        if request.per_label is not None:
            event, labels = self._per_label(budget, request)
            batch, per_step = None, None
        else:
            assert request.expected_batch_size is not None and request.steps is not None
            population = request.population_size or budget.declared_size
            q = min(1.0, request.expected_batch_size / population)
            event = DpSgdEvent(noise_multiplier=1.0, sample_rate=q, steps=request.steps,
                               neighbouring=budget.neighbouring)
            batch, labels = request.expected_batch_size, None
            per_step = request.target_epsilon / request.steps
        release, extra = None, 0.0
        if request.central_images is not None:  # additive too: the release's own target
            extra = request.central_images.target_epsilon
            release = CentralImagesCharge(
                event=GaussianEvent(sigma=1.0, sensitivity=1.0,
                                    neighbouring=budget.neighbouring),
                bound=1.0, noise_std=1.0, epsilon=extra, rdp_charge=extra,
                partitions=["*", *budget.partitions])
        return Plan(
            dataset_id=request.dataset_id, event=event, expected_batch_size=batch,
            job_epsilon=request.target_epsilon, delta=budget.delta, admission_order=8,
            rdp_per_step=per_step, rdp_total=request.target_epsilon, per_label=labels,
            dataset_epsilon_spent_before=spent,
            dataset_epsilon_spent_after=spent + request.target_epsilon + extra,
            dataset_tight_epsilon_after=spent + request.target_epsilon + extra,
            admissible=request.target_epsilon + extra <= remaining + 1e-12,
            max_admissible_target_epsilon=(remaining - extra if remaining > extra else None),
            accountant="fake-additive", central_images=release,
        )

    @staticmethod
    def _per_label(budget: CreateBudget, request: ReserveRequest
                   ) -> tuple[ParallelEvent, dict[str, LabelPlan]]:
        """Each class's run: sigma 1, q_c = batch_c / N̂_c, epsilon = the target."""
        assert request.per_label is not None
        if not budget.class_sizes:
            raise DpsynthError(ErrorCode.INVALID_SPEC, "a per-label job needs class sizes")
        labels = {}
        for name, shape in request.per_label.items():
            size = budget.class_sizes[name]
            event = DpSgdEvent(noise_multiplier=1.0, sample_rate=shape.expected_batch_size / size,
                               steps=shape.steps, neighbouring=budget.neighbouring)
            labels[name] = LabelPlan(event=event, expected_batch_size=shape.expected_batch_size,
                                     class_size=size, job_epsilon=request.target_epsilon,
                                     rdp_per_step=request.target_epsilon / shape.steps,
                                     rdp_total=request.target_epsilon)
        return ParallelEvent(partitions={n: lp.event for n, lp in labels.items()}), labels

    def reserve(self, request: ReserveRequest) -> Reservation:
        """Admit and reserve, or raise 409 ``privacy_budget_exhausted`` with the numbers."""
        with self._lock:
            plan = self.plan(request)
            if not plan.admissible:
                # the real ledger's wording (dpsynth_shared.errors.budget_refusal)
                raise budget_refusal(
                    {"target_epsilon": request.target_epsilon,
                     "dataset_epsilon_spent": plan.dataset_epsilon_spent_before,
                     "epsilon_limit": self.budgets[request.dataset_id].epsilon_limit},
                    best=plan.max_admissible_target_epsilon)
            labels = None if plan.per_label is None else {
                name: LabelReservation(
                    event=lp.event, expected_batch_size=lp.expected_batch_size,
                    class_size=lp.class_size, steps_planned=lp.event.steps,
                    steps_reserved=lp.event.steps, steps_granted=0,
                    job_epsilon=lp.job_epsilon, job_epsilon_granted=0.0)
                for name, lp in plan.per_label.items()}
            steps = request.steps if labels is None else sum(
                lr.steps_reserved for lr in labels.values())
            reservation = Reservation(
                reservation_id=new_reservation_id(), job_id=request.job_id,
                dataset_id=request.dataset_id, state=ReservationState.OPEN, event=plan.event,
                expected_batch_size=request.expected_batch_size, steps_reserved=steps or 0,
                steps_granted=0, current_attempt=1, job_epsilon=plan.job_epsilon,
                job_epsilon_granted=0.0, per_label=labels, plan=plan)
            self.reservations[reservation.reservation_id] = _FakeReservation(
                reservation, request.target_epsilon)
        return reservation

    def close_reservation(self, reservation_id: str,
                          outcome: Literal["succeeded", "failed", "cancelled"]) -> None:
        """Close a reservation; an untouched cancelled one releases its epsilon."""
        with self._lock:
            entry = self.reservations.get(reservation_id)
            if entry is None:
                raise NotFound("reservation", reservation_id)
            entry.outcome = "released" if outcome == "cancelled" else outcome
            self.closed.append((reservation_id, outcome))

    def release_histogram(self, dataset_id: str,
                          request: HistogramRequest) -> HistogramRelease:
        """A class-size histogram: σ of the classic Gaussian mechanism, epsilon = target."""
        with self._lock:
            budget = self.budgets.get(dataset_id)
            if budget is None:
                raise NotFound("budget", dataset_id)
            if budget.class_sizes is not None:
                raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has class sizes")
            spent = self._spent(dataset_id)
            eps = request.target_epsilon
            release = HistogramRelease(
                dataset_id=dataset_id, event=GaussianEvent(
                    sigma=math.sqrt(2 * math.log(1.25 / budget.delta)) / eps, sensitivity=1.0),
                target_epsilon=eps, epsilon=eps, delta=budget.delta, admission_order=8,
                rdp_charge=eps, partitions=["*", *budget.partitions],
                dataset_epsilon_spent_before=spent, dataset_epsilon_spent_after=spent + eps,
                dataset_epsilon_remaining_after=max(0.0, budget.epsilon_limit - spent - eps),
                admissible=spent + eps <= budget.epsilon_limit + 1e-12, charged=False,
                accountant="fake-additive")
            if request.dry_run:
                return release
            if not release.admissible:
                raise BudgetExhausted("the histogram exceeds the remaining budget",
                                      dataset_epsilon_spent=spent,
                                      epsilon_limit=budget.epsilon_limit)
            release = release.model_copy(update={"release_id": new_id("release"),
                                                 "charged": True})
            self.releases.setdefault(dataset_id, []).append(release)
            return release

    def set_class_sizes(self, dataset_id: str, request: SetClassSizes) -> BudgetView:
        """Set the released sizes on the budget, once."""
        with self._lock:
            budget = self.budgets.get(dataset_id)
            if budget is None:
                raise NotFound("budget", dataset_id)
            if budget.class_sizes is not None:
                raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has class sizes")
            if request.release_id not in {r.release_id for r in self.releases.get(dataset_id,
                                                                                   [])}:
                raise DpsynthError(ErrorCode.INVALID_REQUEST, "unknown release")
            self.budgets[dataset_id] = budget.model_copy(
                update={"class_sizes": dict(request.class_sizes)})
        return self.get_budget(dataset_id)

    def ready(self) -> bool:
        """Whether the fake reports ready."""
        return self.is_ready

    def behind_anchor(self) -> bool:
        """The fake has no anchor."""
        return False

    # -- export, verification and policies (issue 4) --------------------------------------
    def entries(self, dataset_id: str) -> list[LedgerEntry]:
        """The fake keeps no chain: an empty history."""
        if dataset_id not in self.budgets:
            raise NotFound("budget", dataset_id)
        return []

    def chain_key(self) -> ChainKey | None:
        """The fake signs nothing."""
        return None

    def verify_budget(self, dataset_id: str) -> VerifyReport:
        """Nothing to verify in the fake: ok, no entries."""
        if dataset_id not in self.budgets:
            raise NotFound("budget", dataset_id)
        return VerifyReport(ok=True, entries=0, head=GENESIS_HASH)

    def recompute(self, dataset_id: str) -> RecomputeReport:
        """The additive fake recomputes to what it recorded."""
        budget = self.get_budget(dataset_id)
        figures = {"dataset_epsilon_spent": budget.dataset_epsilon_spent}
        return RecomputeReport(dataset_id=dataset_id, accountant="fake-additive",
                               conversion="fake", admission_order=8, delta=budget.delta,
                               epsilon_limit=budget.epsilon_limit, recorded=figures,
                               recomputed=figures)

    def update_limit(self, dataset_id: str, request: LimitUpdate) -> BudgetView:
        """Lower the limit (a raise is 422 ``policy_violation``) / set the fraction."""
        with self._lock:
            budget = self.budgets.get(dataset_id)
            if budget is None:
                raise NotFound("budget", dataset_id)
            if request.epsilon_limit is not None and request.epsilon_limit > budget.epsilon_limit:
                raise DpsynthError(ErrorCode.POLICY_VIOLATION, "a limit is only ever lowered",
                                   epsilon_limit=budget.epsilon_limit)
            update = request.model_dump(exclude_none=True)
            self.budgets[dataset_id] = budget.model_copy(update=update)
        return self.get_budget(dataset_id)

    def reconcile(self, request: ReconcileRequest) -> ReconcileReport:
        """The fake loses nothing: it records the request and reports no change."""
        with self._lock:
            self.reconciled.append(request)
            spent = {d: self._spent(d) for d in self.budgets}
        return ReconcileReport(ok=True, anchored_seq=0, head_seq_before=0, head_seq_after=0,
                               entries_replayed=0, spent_before=spent, spent_after=spent)

    def anchor_status(self) -> AnchorStatus:
        """The fake anchors nothing: never behind."""
        return AnchorStatus(location="memory", local_seq=0, local_hash="", anchored_seq=0,
                            anchored_hash="", behind=False, public_key="", key_id="")

    def authorise_evaluation(self, request: EvaluationRequest) -> Evaluation:
        """Record a non-DP evaluation read (nothing charged); 404 for an unknown budget.
        Idempotent on the job id, like the ledger."""
        from dpsynth_api.db import utcnow

        with self._lock:
            if request.dataset_id not in self.budgets:
                raise NotFound("budget", request.dataset_id)
            for made in self.evaluations_made:
                if made.job_id == request.job_id:
                    return made
            evaluation = Evaluation(evaluation_id=f"evl_{uuid.uuid4().hex}",
                                    dataset_id=request.dataset_id,
                                    job_id=request.job_id,
                                    reference_dataset_id=request.reference_dataset_id,
                                    requested_by=request.requested_by, purpose=request.purpose,
                                    created_at=utcnow())
            self.evaluations_made.append(evaluation)
        return evaluation

    def evaluations(self, dataset_id: str) -> list[Evaluation]:
        """The evaluations authorised on the budget."""
        with self._lock:
            return [e for e in self.evaluations_made if e.dataset_id == dataset_id]


@dataclass
class RecordingSender:
    """A :class:`dpsynth_api.ports.TaskSender` that records what it was asked to send."""

    sent: list[tuple[str, int]] = field(default_factory=list)
    is_ready: bool = True

    def send_run_job(self, job_id: str, attempt: int) -> None:
        """Record ``(job_id, attempt)``."""
        self.sent.append((job_id, attempt))

    def ping(self) -> bool:
        """Whether the fake broker reports ready."""
        return self.is_ready
