"""``/healthz`` (process up), ``/readyz`` (DB, ledger, broker), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.instance_proof import proof_headers
from dpsynth_shared.metrics_auth import check_metrics_token
from fastapi import APIRouter, Request, Response
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
def readyz(ctx: ContextDep, response: Response,
           challenge: str | None = None) -> JSONResponse | dict[str, object]:
    """Ready when the database, the ledger and the broker answer (503 otherwise).

    A ledger behind its anchor (its database restored from a backup) still counts as
    answering: it serves reads and refuses every write until an operator runs
    ``dpsynth ledger reconcile-after-restore`` through THIS api, so taking the api out of
    service then would block the fix. The body says so in ``warnings``.

    With ``?challenge=HEX`` and an instance secret configured, the answer (200 or 503)
    carries ``Dpsynth-Instance-Proof``: how ``dpsynth up`` knows that this is the process it
    started and not a foreign server on the port (dpsynth_shared.instance_proof).
    """
    secret = ctx.settings.instance_secret
    proof = proof_headers(secret.get_secret_value() if secret is not None else None, challenge)
    checks = _checks(ctx)
    if all(checks.values()):
        body: dict[str, object] = {"status": "ready", "checks": checks}
        if ctx.ledger.behind_anchor():
            body["warnings"] = ["ledger_behind_anchor: the ledger refuses admissions until "
                                "`dpsynth ledger reconcile-after-restore` is run"]
        response.headers.update(proof)
        return body
    failing = sorted(k for k, ok in checks.items() if not ok)
    problem = problem_response(DpsynthError(ErrorCode.SERVICE_UNAVAILABLE,
                                            f"not ready: {', '.join(failing)}", checks=checks))
    problem.headers.update(proof)
    return problem


@router.get("/metrics", include_in_schema=False)
def metrics(ctx: ContextDep, session: SessionDep, request: Request) -> Response:
    """Prometheus text format: requests, latency, jobs by state, uploads (with the metrics
    token when ``DPSYNTH_API_METRICS_TOKEN`` is set)."""
    token = ctx.settings.metrics_token
    check_metrics_token(request.headers.get("authorization", ""),
                        token.get_secret_value() if token is not None else None)
    ctx.metrics.set_job_counts(jobs_repo.count_by_state(session))
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
