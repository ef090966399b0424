"""Admin endpoint: reconcile the ledger with its anchor and the api's jobs after a restore.

``POST /v1/admin/ledger/reconcile`` (platform admin) collects every DP job the api knows (jobs
with a ledger reservation; their stored privacy block has the plan: σ, q, steps) and sends
them to the ledger's ``POST /v1/admin/reconcile``, which re-charges what its restored
database lost (see ``dpsynth_ledger.service.reconcile``). ``dpsynth ledger
reconcile-after-restore`` calls this endpoint.
"""

from __future__ import annotations

from typing import Any

from dpsynth_shared.ledger_contract import (
    AnchorStatus,
    ApiJobRecord,
    ReconcileReport,
    ReconcileRequest,
)
from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsynth_api.deps import AdminDep, LedgerDep, SessionDep
from dpsynth_api.tables import Dataset, Job
from dpsynth_api.tenants.audit import ALL_TENANTS, audited

router = APIRouter(prefix="/v1/admin/ledger", tags=["admin"])


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def api_job_records(session: Session) -> list[ApiJobRecord]:
    """Every job with a ledger reservation, as the ledger's reconciliation reads it.

    A per-label job has one run per class (σ_c, q_c, steps_c in ``privacy.per_label``); it
    becomes one record per class, each of which the ledger charges on every partition
    (conservative: a class's run touches only its class and ``"*"``).
    """
    budgets = {d.id: d.budget_id or d.id for d in session.scalars(select(Dataset))}
    out: list[ApiJobRecord] = []
    jobs = session.scalars(select(Job).where(Job.reservation_id.is_not(None))
                           .order_by(Job.created_at, Job.id))
    for job in jobs:
        privacy = job.privacy or {}
        assert job.reservation_id is not None
        common = {"dataset_id": budgets.get(job.dataset_id or "", job.dataset_id or ""),
                  "reservation_id": job.reservation_id, "state": job.state,
                  "target_epsilon": _float((job.spec.get("privacy") or {}).get(
                      "target_epsilon")), "progress_step": job.progress_step}
        per_label = privacy.get("per_label")
        if isinstance(per_label, dict) and per_label:
            for label, run in sorted(per_label.items()):
                out.append(ApiJobRecord(
                    job_id=f"{job.id}/{label}", steps=run.get("steps"),
                    noise_multiplier=_float(run.get("noise_multiplier")),
                    sample_rate=_float(run.get("sample_rate")),
                    expected_batch_size=run.get("expected_batch_size"), **common))
            continue
        out.append(ApiJobRecord(
            job_id=job.id, steps=privacy.get("steps") or job.progress_total or None,
            noise_multiplier=_float(privacy.get("noise_multiplier")),
            sample_rate=_float(privacy.get("sample_rate")),
            expected_batch_size=privacy.get("expected_batch_size"), **common))
    return out


@router.post("/reconcile", response_model=ReconcileReport)
def reconcile(session: SessionDep, ledger: LedgerDep, actor: AdminDep) -> ReconcileReport:
    """After a ledger restore: send the api's DP jobs to the ledger's reconciliation and
    return its report (spent epsilon per dataset before and after, jobs re-charged).
    Platform admin only; it touches every tenant's budgets, so it is audited."""
    with audited(actor, "ledger.reconcile", target_tenant_id=ALL_TENANTS) as entry:
        request = ReconcileRequest(api_jobs=api_job_records(session))
        session.rollback()  # a read only; release the connection before the ledger works
        report = ledger.reconcile(request)
        entry.details["api_jobs"] = str(len(request.api_jobs))
    return report


@router.get("/anchor", response_model=AnchorStatus)
def anchor(ledger: LedgerDep, _: AdminDep) -> AnchorStatus:
    """The ledger's chain head against its anchored head (behind: admissions are refused
    until ``dpsynth ledger reconcile-after-restore``)."""
    return ledger.anchor_status()
