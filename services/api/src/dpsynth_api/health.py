"""``/healthz`` (process up), ``/readyz`` (DB, ledger, broker), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from dpsynth_api.context import AppContext
from dpsynth_api.deps import ContextDep, SessionDep
from dpsynth_api.errors import problem_response
from dpsynth_api.jobs import repository as jobs_repo

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


def _checks(ctx: AppContext) -> dict[str, bool]:
    checks = {}
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = True
    except Exception:  # noqa: BLE001 - any error means "not ready"
        checks["database"] = False
    checks["ledger"] = ctx.ledger.ready()
    checks["broker"] = ctx.sender.ping()
    return checks


@router.get("/readyz", response_model=None)
def readyz(ctx: ContextDep) -> JSONResponse | dict[str, object]:
    """Ready when the database, the ledger and the broker answer (503 otherwise)."""
    checks = _checks(ctx)
    if all(checks.values()):
        return {"status": "ready", "checks": checks}
    failing = sorted(k for k, ok in checks.items() if not ok)
    return problem_response(DpsynthError(ErrorCode.SERVICE_UNAVAILABLE,
                                         f"not ready: {', '.join(failing)}", checks=checks))


@router.get("/metrics", include_in_schema=False)
def metrics(ctx: ContextDep, session: SessionDep) -> Response:
    """Prometheus text format: requests, latency, jobs by state, uploads."""
    ctx.metrics.set_job_counts(jobs_repo.count_by_state(session))
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
