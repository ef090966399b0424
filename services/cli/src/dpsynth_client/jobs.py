"""Jobs: submit, follow, wait, cancel, and an evaluate job's report."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dpsynth_shared.job_states import JobState

from dpsynth_client.errors import JobFailed
from dpsynth_client.transport import ApiTransport, ChunkCallback, _items

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ProgressCallback = Callable[[dict[str, Any]], None]


class JobsApi(ApiTransport):
    """``/v1/jobs``: one method per endpoint, plus :meth:`wait_for_job` and
    :meth:`submit_and_wait`."""

    def submit_job(self, spec: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Submit a job spec; with ``dry_run`` the api answers the plan and budget impact."""
        params = {"dry_run": "true"} if dry_run else None
        return self._request(  # type: ignore[no-any-return]
            "POST", "/v1/jobs", json=spec, params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        """One job (state, progress, result, error)."""
        return self._request("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def list_jobs(self, *, page_size: int = 50, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every job of the tenant, following ``next_cursor`` page by page."""
        return self._paged("/v1/jobs", page_size=page_size, **filters)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Ask for cancellation (charged steps stay charged)."""
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def job_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """The artifacts a job produced."""
        return _items(self._request("GET", f"/v1/jobs/{job_id}/artifacts"))

    def wait_for_job(self, job_id: str, timeout: float = 3600.0, poll: float = 2.0,
                     on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Poll a job until it is succeeded, failed or cancelled, and return it.

        Raises:
            TimeoutError: when the job is still running after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job.get("state") in TERMINAL_STATES:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.get('state')} after {timeout}s")
            time.sleep(poll)

    def submit_and_wait(self, spec: dict[str, Any], *, timeout: float = 3600.0,
                        poll: float = 2.0,
                        on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Submit ``spec``, poll the job until it ends, and return it once it succeeded.

        Args:
            spec: a job spec, as for :meth:`submit_job` (e.g. ``yaml.safe_load`` of a file).
            timeout: seconds to wait for the job to end.
            poll: seconds between two reads of the job.
            on_progress: called with the job document after each read (state, progress).

        Returns:
            The succeeded job: ``result`` holds its figures, ``artifacts`` what it made
            (``Client.download_corpus(job)`` loads a generate job's corpus).

        Raises:
            DpsynthError: the api refused the spec (e.g. ``privacy_budget_exhausted``).
            JobFailed: the job failed or was cancelled; ``.job`` is its final document.
            TimeoutError: the job still runs after ``timeout`` seconds (it keeps running:
                :meth:`cancel_job` stops it).
        """
        submitted = self.submit_job(spec)
        job = self.wait_for_job(str(submitted["job_id"]), timeout=timeout, poll=poll,
                                on_progress=on_progress)
        if job.get("state") != JobState.SUCCEEDED:
            raise JobFailed(job)
        return job

    # -- evaluation reports (issue 5) ----------------------------------------------------
    def get_report(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}/report``: an evaluate job's ``report.json`` document
        (:class:`dpsynth_shared.evaluation.EvaluationReport`; its ``headline`` holds the
        numbers). A report on a private reference needs the owner scope (403 otherwise);
        409 while the job has no report yet."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/jobs/{job_id}/report")

    def download_report(self, job_id: str, dest: Path | str, format: str = "html", *,
                        on_chunk: ChunkCallback | None = None) -> Path:
        """Save an evaluate job's report to ``dest``: the self-contained HTML page
        (``format="html"``) or the JSON document (``format="json"``); temp file + rename.

        Raises:
            ValueError: for another format.
        """
        if format not in ("html", "json"):
            raise ValueError(f"format must be 'html' or 'json', not {format!r}")
        return self._download(f"/v1/jobs/{job_id}/report?format={format}", dest, on_chunk)
