"""``POST /v1/accountant-comparisons``: the σ that RDP, GDP and PLD give one planned DP-SGD
job, and the one the ledger uses (transport only; the ledger computes it, docs/accountants.md).

Stateless and charged nothing: the body is validated here (its bounded ranges), then passed
to the ledger's ``POST /v1/accountant-comparisons``; the ledger's problems (422
``plan_too_large`` / ``invalid_spec``, 503 ``ledger_busy``, ``ledger_unavailable``) come
back as they are.
"""

from __future__ import annotations

from dpsynth_shared.accountant_report import AccountantComparison, AccountantComparisonRequest
from fastapi import APIRouter

from dpsynth_api.deps import LedgerDep, ReaderDep

router = APIRouter(prefix="/v1", tags=["ledger"])


@router.post("/accountant-comparisons", response_model=AccountantComparison,
             summary="Compare the RDP, GDP and PLD noise multipliers of a planned job")
def compare_accountants(body: AccountantComparisonRequest, principal: ReaderDep,
                        ledger: LedgerDep) -> AccountantComparison:
    """For a target (ε, δ, sample rate q, steps): the noise multiplier σ each accountant
    calibrates (RDP; Gaussian DP by the central limit theorem, an approximation and not a
    bound; PLD, which PRV computes too), every σ evaluated by every accountant, the σ the
    ledger gives such a job (PLD) and the ε its RDP filter would charge for it at the
    dataset's fixed order (``epsilon_limit``: the dataset's limit, default the target).
    Charges nothing. 422 ``invalid_request`` outside the ranges, 422 ``plan_too_large``
    beyond the ledger's ``max_steps``, 422 ``invalid_spec`` for an unreachable target."""
    return ledger.accountant_comparison(body)
