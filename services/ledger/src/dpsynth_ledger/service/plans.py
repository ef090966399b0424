"""Use cases: plan a job against a budget (calibrate its runs, the charges they would add, the
largest target that fits) and the numbers of a refusal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, Neighbouring, ParallelEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ledger_contract import (
    LabelPlan,
    Plan,
    PlanRequest,
)
from dpsynth_shared.plan_limits import check_plan_size
from dpsynth_shared.release_contract import CentralImagesCharge
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    GROUP_NAME,
    REPLACE_ONE_PLD_NAME,
    WHOLE_DATASET,
    add_up,
    charge_step,
    check_neighbouring,
    dp_sgd_epsilon,
    max_admissible_target,
    mul_up,
    pld_epsilon,
    sum_up,
)
from dpsynth_ledger.book import disjoint_of, figures, flt, snapshot, touched
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Accumulator, Budget, ReservationRow
from dpsynth_ledger.service.central_terms import planned_charge
from dpsynth_ledger.views import job_event, released_events


@dataclass(frozen=True)
class RunPlan:
    """One calibrated DP-SGD run of a candidate job (``"*"``, or one class per label)."""

    partition: str
    sigma: float
    q: float
    steps: int
    batch: int
    size: int
    rdp_per_step: float
    rdp_total: float
    job_epsilon: float

    @property
    def event(self) -> DpSgdEvent:
        return DpSgdEvent(noise_multiplier=self.sigma, sample_rate=self.q, steps=self.steps)


def _run(budget: Budget, *, partition: str, target: float, batch: int, steps: int,
         size: int, ctx: LedgerContext) -> RunPlan:
    """Calibrate one run: q = batch / size (docs/privacy.md, refused above 1), σ for the
    standalone target (PLD), and its RDP at the filter's order."""
    if batch > size:
        where = "the declared dataset size" if partition == WHOLE_DATASET else \
            f"the declared size of class {partition!r}"
        raise DpsynthError(ErrorCode.INVALID_REQUEST, f"expected_batch_size exceeds {where}")
    q = batch / size
    # on a replace-one dataset: σ meets the target as the job's standalone replace-one ε
    # (dp_accounting's REPLACE_ONE PLD of the Poisson-subsampled Gaussian), and the filter is
    # charged through group privacy at distance 2 (charge_step: 3·RDP_add/remove(2α*))
    relation = budget.neighbouring
    try:
        sigma = ctx.heavy.noise_multiplier(target, q, steps, budget.delta, relation)
    except ValueError as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    per_step = charge_step(sigma, q, budget.admission_order, relation)
    return RunPlan(partition=partition, sigma=sigma, q=q, steps=steps, batch=batch, size=size,
                   rdp_per_step=per_step, rdp_total=mul_up(steps, per_step),
                   job_epsilon=dp_sgd_epsilon(sigma, q, steps, budget.delta,
                                              ctx.discretization, relation))


def plan_runs(budget: Budget, request: PlanRequest, ctx: LedgerContext) -> list[RunPlan]:
    """The candidate's runs: one on ``"*"``, or one per class for a per-label job.

    Raises:
        DpsynthError: ``plan_too_large`` beyond the ledger's plan limits; ``invalid_spec``
            for a per-label job on a dataset without declared class sizes;
            ``invalid_request`` for a class outside the declared labels;
            ``unsupported_neighbouring`` for a replace-one job on an add/remove dataset.
    """
    check_plan_size(request, ctx.heavy.limits)  # before any calibration (plan_too_large)
    check_neighbouring(DpSgdEvent(noise_multiplier=1.0, sample_rate=1.0, steps=0,
                                  neighbouring=request.neighbouring), budget.neighbouring)
    population = request.population_size
    if population is not None and budget.delta >= 1.0 / population:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "delta must be below 1/population_size "
                           "(the public size of the derived or linked dataset sampled from)")
    if request.central_images is not None and request.per_label is not None:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "central_images is a whole-dataset "
                           "finetune's release; a per-label job makes none")
    if request.per_label is None:
        assert request.expected_batch_size is not None and request.steps is not None
        # q = b / N̂: a derived or linked dataset samples from its own public size N̂_child
        return [_run(budget, partition=WHOLE_DATASET, target=request.target_epsilon,
                     batch=request.expected_batch_size, steps=request.steps,
                     size=population or budget.declared_size, ctx=ctx)]
    if population is not None:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "a per-label job samples each class "
                           "at its declared class size; population_size is for whole-dataset "
                           "jobs")
    sizes = budget.class_sizes
    if not sizes:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a per-label job needs public class sizes: "
                           "the dataset's owner declares class_sizes at upload")
    unknown = sorted(set(request.per_label) - set(sizes))
    if unknown:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "per_label names classes that are not "
                           "declared labels of the dataset", classes=unknown)
    return [_run(budget, partition=c, target=request.target_epsilon,
                 batch=shape.expected_batch_size, steps=shape.steps, size=int(sizes[c]), ctx=ctx)
            for c, shape in sorted(request.per_label.items())]


def new_charges(runs: list[RunPlan], accs: Mapping[str, Accumulator],
                disjoint: bool = True) -> dict[str, float]:
    """The RDP the candidate adds per partition it touches (a class run touches its class;
    when the labels are not disjoint in the privacy unit, every class run touches every
    partition and the classes' RDP is summed, rounded up: :func:`~dpsynth_ledger.book.touched`)."""
    adds: dict[str, list[float]] = {}
    for run in runs:
        for p in touched(run.partition, accs, disjoint):
            adds.setdefault(p, []).append(run.rdp_total)
    return {p: v[0] if len(v) == 1 else sum_up(v) for p, v in adds.items()}


def max_target(budget: Budget, runs: list[RunPlan], *, committed: Mapping[str, float],
               reserved: Mapping[str, float], ctx: LedgerContext) -> float | None:
    """The largest target of the candidate's shape that the filter admits now.

    Per label every class is calibrated to the same target, so it is the min over classes
    of each class's largest admissible target against its own partition's room. When the
    labels are not disjoint (sequential composition: the K classes' RDP is summed on every
    partition) each class gets 1/K of the room, shrunk by 1e-9 against rounding: a target
    that IS admitted, though possibly not the largest (conservative).
    """
    f = flt(budget)
    best: float | None = None
    sequential = len(runs) > 1 and not disjoint_of(budget)
    for run in runs:
        parts = touched(run.partition, committed, disjoint_of(budget))
        room = f.room(committed=committed, reserved=reserved, partitions=parts)
        if sequential:
            room = room / len(runs) * (1 - 1e-9)
        value = max_admissible_target(room, run.q, run.steps, budget.admission_order,
                                      budget.delta, ctx.discretization, budget.neighbouring)
        if value is None:
            return None
        best = value if best is None else min(best, value)
    return best


def make_plan(session: Session, *, request: PlanRequest, ctx: LedgerContext) -> Plan:
    """Calibrate σ for the standalone target and show the job's cost (no lock, no write)."""
    return plan_with_runs(session, request=request, ctx=ctx)[0]


def plan_with_runs(session: Session, *, request: PlanRequest, ctx: LedgerContext,
                   with_report: bool = True) -> tuple[Plan, list[RunPlan]]:
    """:func:`make_plan` and the calibrated runs behind it (for the reservation rows).

    ``with_report=False`` (an admission) skips the largest admissible target and the tight
    figure after the job (PLD evaluations that were most of an admission's time): a
    reservation that is admitted does not need them, and a refusal computes the first.
    With them (plans, dry runs) they are computed in a heavy slot (heavy.py).
    """
    budget = repo.get_budget(session, request.dataset_id)
    if budget is None:
        raise NotFound("budget", request.dataset_id)
    runs = plan_runs(budget, request, ctx)
    accs = repo.accumulators(session, budget.dataset_id)
    reservations = repo.reservations_of(session, budget.dataset_id)
    release = None
    if request.central_images is not None:  # the training partitions, as the release charges
        release = planned_charge(budget, request.central_images,
                                 touched(WHOLE_DATASET, accs), ctx)
    plan = plan_from(budget, accs=accs, reservations=reservations, runs=runs,
                     per_label=request.per_label is not None, ctx=ctx,
                     released=released_events(session, budget.dataset_id),
                     with_report=with_report, release=release)
    return plan, runs


def with_release(new: Mapping[str, float],
                 release: CentralImagesCharge | None) -> dict[str, float]:
    """A job's new RDP per partition with its central-image release added (rounded up)."""
    out = dict(new)
    if release is not None:
        for p in release.partitions:
            out[p] = add_up(out.get(p, 0.0), release.rdp_charge)
    return out


def plan_from(budget: Budget, *, accs: dict, reservations: list[ReservationRow],  # type: ignore[type-arg]
              runs: list[RunPlan], per_label: bool, ctx: LedgerContext,
              released: list[DpSgdEvent | GaussianEvent] | None = None,
              with_report: bool = True, release: CentralImagesCharge | None = None) -> Plan:
    """The plan of a calibrated job against a snapshot of the dataset's accounts
    (``released``: the dataset's charged one-shot releases, for the tight figure;
    ``with_report=False``: the largest admissible target and the tight figure after the
    job are left out, None; the tight figure is also None when the composition is longer
    than ``max_tight_composition``; ``release``: the job's central-image release, composed
    into the figures after the job and ``admissible``, and left beside the largest target
    as room already taken)."""
    f = flt(budget)
    committed = {p: a.committed for p, a in accs.items()}
    reserved = {p: a.reserved for p, a in accs.items()}
    disjoint = disjoint_of(budget)
    new = with_release(new_charges(runs, accs, disjoint), release)
    after = max(f.total_after(committed[p], reserved[p], new[p]) if p in new
                else add_up(committed[p], reserved[p]) for p in accs)
    fixed: list[DpSgdEvent | GaussianEvent | ParallelEvent] = [
        job_event(r, (lambda u: u.steps_reserved) if r.state != "closed"
                  else (lambda u: u.steps_granted)) for r in reservations]
    fixed += released or []
    if release is not None:
        fixed.append(release.event)
    event: DpSgdEvent | ParallelEvent = runs[0].event
    labels = None
    composition, notes = composition_notes(budget, per_label)
    if release is not None:
        notes.append(
            f"the job first releases its central images (a {release.event.kind} event, "
            f"standalone epsilon {release.epsilon:.4g}, RDP {release.rdp_charge:.4g} at the "
            "order on every training partition): dataset_epsilon_spent_after, the tight "
            "figure and admissible compose it with DP-SGD; job_epsilon and rdp_total are the "
            "DP-SGD part's. The reservation holds the DP-SGD part; the release is charged as "
            "its own event when the job starts")
    job_epsilon = max(r.job_epsilon for r in runs)
    rdp_total = max(r.rdp_total for r in runs)
    if per_label and composition == "sequential":  # the job's models together: composed
        job_epsilon = pld_epsilon([r.event for r in runs], budget.delta, ctx.discretization,
                                  dataset=budget.neighbouring)
        rdp_total = max(new.values())
    if per_label:
        event = ParallelEvent(partitions={r.partition: r.event for r in runs})
        labels = {r.partition: LabelPlan(
            event=r.event, expected_batch_size=r.batch, class_size=r.size,
            job_epsilon=r.job_epsilon, rdp_per_step=r.rdp_per_step, rdp_total=r.rdp_total)
            for r in runs}
    best: float | None = None
    tight_after: float | None = None
    if with_report:
        with ctx.heavy.slot("a plan's report figures"):
            beside = with_release(reserved, release)  # the release's room is not the job's
            best = max_target(budget, runs, committed=committed, reserved=beside, ctx=ctx)
            if len(fixed) + len(runs) <= ctx.heavy.max_composition:
                tight_after = pld_epsilon([*fixed, event], budget.delta, ctx.discretization,
                                          dataset=budget.neighbouring, disjoint=disjoint)
    return Plan(
        dataset_id=budget.dataset_id, event=event,
        expected_batch_size=None if per_label else runs[0].batch,
        job_epsilon=job_epsilon,
        delta=budget.delta, admission_order=budget.admission_order,
        rdp_per_step=None if per_label else runs[0].rdp_per_step,
        rdp_total=rdp_total,
        dataset_epsilon_spent_before=figures(budget, accs)["dataset_epsilon_spent"],
        dataset_epsilon_spent_after=f.epsilon(after),
        dataset_tight_epsilon_after=tight_after,
        admissible=f.admits(committed=committed, reserved=reserved, new=new),
        max_admissible_target_epsilon=best,
        accountant=ACCOUNTANT_NAME, per_label=labels, composition=composition, notes=notes,
        central_images=release,
    )


def composition_notes(budget: Budget, per_label: bool) -> tuple[str, list[str]]:
    """How a job's runs enter the budget (``Plan.composition``) and what the plan assumed,
    in words (``Plan.notes``): the neighbouring relation, the privacy unit, the labels."""
    notes: list[str] = []
    if budget.neighbouring == Neighbouring.REPLACE_ONE:
        notes.append(
            "replace-one dataset: DP-SGD is analysed add/remove and a replaced record is at "
            "add/remove distance 2, so the job is charged through group privacy at distance 2 "
            "(Mironov 2017, Prop. 2): the filter adds 3 x RDP_add/remove(2 alpha*) per step "
            f"[{GROUP_NAME}]. job_epsilon and target_epsilon are the job's standalone "
            f"replace-one epsilon by {REPLACE_ONE_PLD_NAME}: a tight figure, an upper bound "
            "(pessimistic discretisation); the guarantee the ledger admits on is the filter "
            "figure")
    if budget.privacy_unit == "subject":
        notes.append(
            "privacy unit: subject (user-level DP-SGD): q and N̂ count subjects (q = expected "
            "number of sampled subjects per step / N̂ subjects; one clipped contribution per "
            "sampled subject); every figure protects a whole subject")
    if not per_label:
        return "single", notes
    if disjoint_of(budget):
        notes.append(
            "labels disjoint in the privacy unit: the classes' runs compose in parallel; each "
            "class's RDP is charged to its own partition and the dataset's figure is the max "
            "over partitions")
        return "parallel", notes
    notes.append(
        "labels NOT disjoint in the privacy unit (a unit has images in two or more classes): "
        "the classes' runs compose sequentially; every class's RDP is charged to every "
        "partition ('*' and every label), i.e. summed across classes; job_epsilon is the "
        "composition of all the classes' runs (each class model alone: per_label[c]"
        ".job_epsilon)")
    return "sequential", notes


def refusal_numbers(budget: Budget, accs: dict, *, target: float,  # type: ignore[type-arg]
                    job_epsilon: float, new: Mapping[str, float]) -> dict[str, object]:
    """The numbers a refusal carries (observed under the lock); ``new`` per partition."""
    fig = figures(budget, accs)
    after = max((add_up(add_up(accs[p].committed, accs[p].reserved), amount)
                 for p, amount in new.items()), default=fig["rdp_committed_plus_reserved"])
    numbers: dict[str, object] = {
        "epsilon_limit": budget.epsilon_limit,
        "dataset_epsilon_spent": fig["dataset_epsilon_spent"],
        "dataset_epsilon_reserved": fig["dataset_epsilon_reserved"],
        "target_epsilon": target, "job_epsilon": job_epsilon,
        "admission_order": budget.admission_order, "rdp_budget": budget.rdp_budget,
        "rdp_committed": fig["rdp_committed"], "rdp_reserved": fig["rdp_reserved"],
        "rdp_requested": max(new.values(), default=0.0),
        "rdp_after": after,
        "accumulators": snapshot(accs),
    }
    if set(new) != set(touched(WHOLE_DATASET, accs)):  # a per-label job: say where it overflows
        numbers["rdp_requested_by_partition"] = dict(sorted(new.items()))
        numbers["partitions_over_budget"] = sorted(
            p for p, amount in new.items()
            if flt(budget).total_after(accs[p].committed, accs[p].reserved, amount)
            > budget.rdp_budget)
    return numbers
