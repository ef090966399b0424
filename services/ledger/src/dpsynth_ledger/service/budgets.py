"""Use cases: create a budget and read it (planning a job against it:
:mod:`~dpsynth_ledger.service.plans`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ledger_contract import (
    BudgetView,
    CreateBudget,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    CONVERSION_NAME,
    HOLDOUT,
    WHOLE_DATASET,
    admission_order,
    epsilon_to_rdp_budget,
)
from dpsynth_ledger.chain import append_entry
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget
from dpsynth_ledger.service import sizes
from dpsynth_ledger.views import budget_view


def create_budget(session: Session, *, request: CreateBudget, ctx: LedgerContext) -> BudgetView:
    """Create a dataset's budget: fix α* and the RDP budget, one accumulator per partition.

    Raises:
        DpsynthError: ``conflict`` when the dataset already has a budget; ``invalid_request``
            when δ ≥ 1/N̂ (docs/privacy.md) or a label is named ``"*"``, or the N̂ of a DP
            count (``size_release``) has a σ below calibration; BudgetExhausted when that
            count alone exceeds the limit (nothing is created).
    """
    if request.delta >= 1.0 / request.declared_size:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "delta must be below 1/declared_size")
    if {WHOLE_DATASET, HOLDOUT} & set(request.partitions) or len(set(request.partitions)) != len(
            request.partitions):
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"labels must be distinct and not '*' or {HOLDOUT!r}")
    check_class_sizes(request)
    order = admission_order(request.epsilon_limit, request.delta)
    rdp_budget = epsilon_to_rdp_budget(request.epsilon_limit, order, request.delta)
    sizes.check_size_release(request, order, rdp_budget, ctx)  # a DP count of N̂ must fit
    budget = Budget(
        dataset_id=request.dataset_id, tenant_id=request.tenant_id,
        epsilon_limit=request.epsilon_limit, delta=request.delta,
        declared_size=request.declared_size, neighbouring=str(request.neighbouring),
        admission_order=order,
        rdp_budget=rdp_budget,
        created_at=datetime.now(UTC), class_sizes=request.class_sizes,
        privacy_unit=str(request.privacy_unit),
        partitions_disjoint=request.partitions_disjoint,
        warning_fraction=request.warning_fraction,
        epsilon_limit_initial=request.epsilon_limit,
    )
    partitions = [WHOLE_DATASET, *request.partitions]
    try:
        repo.insert_budget(session, budget, partitions)
    except IntegrityError as exc:
        session.rollback()
        raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has a budget") from exc
    append_entry(session, dataset_id=budget.dataset_id, kind="budget_created", payload={
        "tenant_id": budget.tenant_id, "epsilon_limit": budget.epsilon_limit,
        "delta": budget.delta, "declared_size": budget.declared_size,
        "neighbouring": budget.neighbouring, "partitions": partitions,
        "admission_order": order, "rdp_budget": budget.rdp_budget,
        "conversion": CONVERSION_NAME,
        # the replay (chain_replay.Replay) routes charges by these two: group privacy on a
        # replace-one dataset, sequential per-label composition when labels are not disjoint
        "privacy_unit": budget.privacy_unit, "partitions_disjoint": budget.partitions_disjoint,
        "warning_fraction": budget.warning_fraction,
        **({"class_sizes": request.class_sizes} if request.class_sizes is not None else {}),
        # how N̂ was made public: declared, a charged DP count (next entry) or, under
        # replace-one only, the true count
        "declared_size_source": request.declared_size_source,
    })
    if request.size_release is not None:  # the budget's first DP event, same transaction
        sizes.record_size_release(session, budget, request, ctx)
    session.commit()
    return budget_view(session, budget, ctx.discretization, inline=ctx.tight_inline)


def check_class_sizes(request: CreateBudget) -> None:
    """Declared class sizes: one per declared label, each in [1, declared_size].

    Each N̂_c sets the class's sample rate q_c = expected_batch_size_c / N̂_c of a per-label
    job. The owner declares them public (the api checks each against the true class count
    at upload); N̂_c ≤ N̂ keeps the dataset's δ < 1/N̂ ≤ 1/N̂_c for every class's model.

    Raises:
        DpsynthError: ``invalid_request``.
    """
    if request.class_sizes is not None:
        check_sizes(request.class_sizes, request.partitions, request.declared_size)


def check_sizes(sizes: Mapping[str, int], labels: list[str], declared_size: int) -> None:
    """Class sizes name exactly ``labels``, each in [1, ``declared_size``].

    Raises:
        DpsynthError: ``invalid_request``.
    """
    if set(sizes) != set(labels):
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           "class_sizes must name exactly the declared labels")
    bad = sorted(c for c, n in sizes.items() if not 1 <= n <= declared_size)
    if bad:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "every class size must be at least 1 "
                           "and at most the declared dataset size", classes=bad)


def get_budget(session: Session, *, dataset_id: str, ctx: LedgerContext,
               with_history: bool = True) -> BudgetView:
    """The dataset's budget view (filter and tight figures, charge history)."""
    budget = repo.get_budget(session, dataset_id)
    if budget is None:
        raise NotFound("budget", dataset_id)
    return budget_view(session, budget, ctx.discretization, with_history,
                       inline=ctx.tight_inline)
