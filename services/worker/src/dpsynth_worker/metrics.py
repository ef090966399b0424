"""Prometheus metrics of a worker process.

Only data-independent values: job types, outcomes, step counters. Nothing computed from
private data (loss, gradient or clipping statistics) is ever exported (docs/privacy.md).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

JOBS_STARTED = Counter("jobs_started_total", "Job attempts claimed by this worker", ["type"])
JOBS_FINISHED = Counter("jobs_finished_total", "Job attempts finished by this worker",
                        ["type", "outcome"])
JOB_STEP = Gauge("job_step", "Current step of the running job attempt (data-independent)")
JOB_TOTAL_STEPS = Gauge("job_total_steps", "Total steps of the running job attempt")
AUDIT_VERDICTS = Counter(
    "privacy_audit_verdicts_total", "Finished privacy audits (public stand-ins only) by "
    "verdict: rejected = the running code leaked more than its claim, confirmed by a re-run "
    "with fresh canaries; unconfirmed = one run rejected, its re-run did not",
    ["verdict", "engine"])
CLAIMS_REFUSED = Counter("claims_refused_total", "Task messages dropped by a refused claim")


def serve_metrics(port: int) -> None:
    """Expose the default registry on ``port`` (a daemon thread)."""
    start_http_server(port)
