"""Prometheus metrics of the api. Nothing computed from private data is ever exported:
only request counts/latencies by route template, job counts by state, upload counts."""

from __future__ import annotations

from collections.abc import Mapping

from dpsynth_shared.job_states import JobState
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# what the reaper did to jobs whose worker was lost (jobs/reaper.py, ReapReport)
REAPED_OUTCOMES = ("interrupted", "cancelled", "requeued", "failed")


class ApiMetrics:
    """One registry per app instance (several apps can live in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("dpsynth_api_requests_total", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("dpsynth_api_request_duration_seconds", "HTTP latency",
                                 ["method", "route"], registry=self.registry)
        self.jobs = Gauge("dpsynth_api_jobs", "jobs by state", ["state"], registry=self.registry)
        self.uploads = Counter("dpsynth_api_uploads_total", "dataset and model uploads",
                               ["kind", "outcome"], registry=self.registry)
        # what the upload sweeper removed (sweeper.py): kind = spool | object
        self.swept = Counter("dpsynth_api_swept_total", "orphaned staged uploads and "
                             "objects removed", ["kind"], registry=self.registry)
        self.swept_bytes = Counter("dpsynth_api_swept_bytes_total", "bytes of orphaned "
                                   "staged uploads and objects removed", ["kind"],
                                   registry=self.registry)
        # the reaper (jobs/reaper.py): tasks of unclaimed queued jobs sent again, and jobs
        # it moved because their worker was lost (outcome: REAPED_OUTCOMES)
        self.jobs_resent = Counter("dpsynth_api_jobs_resent_total", "tasks of queued jobs "
                                   "no worker claimed, sent again by the reaper",
                                   registry=self.registry)
        self.jobs_reaped = Counter("dpsynth_api_jobs_reaped_total", "jobs the reaper moved "
                                   "after their worker was lost", ["outcome"],
                                   registry=self.registry)
        for outcome in REAPED_OUTCOMES:
            self.jobs_reaped.labels(outcome=outcome)
        for state in JobState:
            self.jobs.labels(state=str(state)).set(0)

    def count_reap(self, counts: Mapping[str, int]) -> None:
        """Add one reaper pass's counts (``ReapReport.counts()``)."""
        self.jobs_resent.inc(counts.get("resent", 0))
        for outcome in REAPED_OUTCOMES:
            self.jobs_reaped.labels(outcome=outcome).inc(counts.get(outcome, 0))

    def set_job_counts(self, counts: dict[str, int]) -> None:
        """Refresh the jobs-by-state gauge (at scrape time)."""
        for state in JobState:
            self.jobs.labels(state=str(state)).set(counts.get(str(state), 0))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
