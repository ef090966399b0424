"""The dpsynth Python client: one method per REST endpoint, problem+json → DpsynthError.

Auth is always the ``Authorization: Bearer`` header; the key is never put in a URL.
Methods return the decoded JSON bodies (dicts) so the client keeps working while the api
grows new fields.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from dpsynth_shared.job_states import JobState

from dpsynth_client.errors import raise_for_problem, unreachable

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ProgressCallback = Callable[[dict[str, Any]], None]
RETRY_AFTER_CAP_S = 10.0  # a 429 is retried once, after Retry-After but never longer


class Client:
    """A typed-enough wrapper over the dpsynth REST api.

    Args:
        base_url: the api's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: a key created by ``POST /v1/tenants`` or ``/v1/tenants/{id}/keys``.
        timeout: seconds for connect/read of each request (uploads and downloads stream).
        transport: an httpx transport (tests pass an in-process one).
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        )

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "POST":
            # one key per call, kept by the retry below: the api runs the POST at most once
            kwargs["headers"] = {"Idempotency-Key": uuid.uuid4().hex,
                                 **(kwargs.get("headers") or {})}
        response = self._send(method, path, **kwargs)
        if response.status_code == 429:
            time.sleep(_retry_after(response))
            for file in (kwargs.get("files") or {}).values():
                file[1].seek(0)  # an upload's stream is sent again from its start
            response = self._send(method, path, **kwargs)
        raise_for_problem(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc

    # -- health --------------------------------------------------------------------------
    def healthz(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return self._request("GET", "/healthz")  # type: ignore[no-any-return]

    def readyz(self) -> dict[str, Any]:
        """``GET /readyz``."""
        return self._request("GET", "/readyz")  # type: ignore[no-any-return]

    # -- tenants & keys (admin) ----------------------------------------------------------
    def create_tenant(self, name: str, *, scopes: list[str] | None = None) -> dict[str, Any]:
        """Create a tenant and its first key (``key.api_key`` is shown once)."""
        body: dict[str, Any] = {"name": name}
        if scopes is not None:
            body["scopes"] = scopes
        return self._request("POST", "/v1/tenants", json=body)  # type: ignore[no-any-return]

    def create_key(self, tenant_id: str, scopes: list[str], *,
                   name: str | None = None) -> dict[str, Any]:
        """Add a key with ``scopes`` to a tenant."""
        body: dict[str, Any] = {"scopes": scopes}
        if name is not None:
            body["name"] = name
        return self._request(  # type: ignore[no-any-return]
            "POST", f"/v1/tenants/{tenant_id}/keys", json=body)

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        """Revoke a key (it stops authenticating at once)."""
        return self._request("POST", f"/v1/keys/{key_id}/revoke")  # type: ignore[no-any-return]

    # -- datasets ------------------------------------------------------------------------
    def upload_dataset(self, path: Path | str, *, name: str, visibility: str,
                       epsilon_limit: float | None = None, delta: float | None = None,
                       label_domain: list[str] | None = None,
                       declared_size: int | None = None,
                       class_sizes: dict[str, int] | None = None,
                       on_overlap: str | None = None, privacy_unit: str | None = None,
                       size_epsilon: float | None = None,
                       partitions_disjoint: bool | None = None,
                       subject_column: str | None = None,
                       holdout_fraction: float | None = None,
                       holdout_key: str | None = None,
                       on_duplicate: str | None = None) -> dict[str, Any]:
        """Upload a dataset file (zip/tar image folder, ``.npz`` or Parquet).

        Sent as multipart: ``file`` and ``metadata`` (a JSON string). Optional privacy
        fields left ``None`` are omitted so the api applies its defaults (e.g. delta).
        ``class_sizes`` declares public per-class sizes (each ≥ the true count), which
        per-label training needs. A private dataset states its public size N̂:
        ``declared_size`` (an upper bound on its records, or subjects) or ``size_epsilon``
        (a DP count charged to its budget); ``partitions_disjoint`` declares that every
        record (subject) is in one class. ``on_overlap="link"``: a private upload sharing records
        with one of your private datasets charges that dataset's budget instead of being
        refused (409 ``private_data_overlap``). ``privacy_unit="subject"``: one record is
        every image of one subject (user-level DP; N̂ counts subjects), with the subject ids
        in ``subject_column`` (npz array / Parquet column, default ``subjects``) or, for an
        image folder, a ``subjects.csv`` (``path,subject``) at the archive root.
        ``holdout_fraction`` sets about that share of the units aside at upload, each by a
        keyed hash of itself (1-stable): never trained on, excluded from the declared size,
        the real test data of ``evaluate`` jobs. ``holdout_key`` (write-only, never stored
        or shown; at least 16 characters) is that hash's key: the same key holds out the
        same records in every version of a dataset (default: a key drawn by the api).
        ``on_duplicate``: records with identical pixels inside the upload are refused (422
        ``duplicate_records``, a private upload's default) or, with ``"deduplicate"``, kept
        once (the first copy); copies that disagree (label, subject, mask) are refused.
        """
        metadata = {"name": name, "visibility": visibility, "epsilon_limit": epsilon_limit,
                    "delta": delta, "label_domain": label_domain, "declared_size": declared_size,
                    "class_sizes": class_sizes, "on_overlap": on_overlap,
                    "privacy_unit": privacy_unit, "subject_column": subject_column,
                    "holdout_fraction": holdout_fraction, "holdout_key": holdout_key,
                    "size_epsilon": size_epsilon, "partitions_disjoint": partitions_disjoint}
        metadata["on_duplicate"] = on_duplicate
        metadata = {k: v for k, v in metadata.items() if v is not None}
        path = Path(path)
        with path.open("rb") as handle:
            return self._request(  # type: ignore[no-any-return]
                "POST", "/v1/datasets", data={"metadata": json.dumps(metadata)},
                files={"file": (path.name, handle, "application/octet-stream")})

    def list_datasets(self) -> list[dict[str, Any]]:
        """The tenant's datasets (every page)."""
        return list(self._paged("/v1/datasets"))

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        """One dataset."""
        return self._request("GET", f"/v1/datasets/{dataset_id}")  # type: ignore[no-any-return]

    def get_budget(self, dataset_id: str) -> dict[str, Any]:
        """The dataset's budget view (filter spent, tight figure, reserved, remaining...)."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/datasets/{dataset_id}/budget")

    def release_class_sizes(self, dataset_id: str, *, epsilon: float,
                            dry_run: bool = False) -> dict[str, Any]:
        """Release a private dataset's public class sizes through a Gaussian histogram
        charged to its budget (``epsilon`` at the dataset's delta); ``dry_run`` shows sigma
        and the budget impact without charging. A release cannot be undone."""
        return self._request(  # type: ignore[no-any-return]
            "POST", f"/v1/datasets/{dataset_id}/class-sizes/release",
            json={"target_epsilon": epsilon, "dry_run": dry_run})

    def derive_dataset(self, dataset_id: str, *, name: str, kind: str,
                       classes: list[str] | None = None, fraction: float | None = None,
                       part: str | None = None,
                       declared_size: int | None = None) -> dict[str, Any]:
        """``POST /v1/datasets/{id}/derive``: a class subset (``kind="subset"``, ``classes``)
        or a keyed-hash split (``kind="split"``: about ``fraction`` of the records in
        ``part`` "train", the rest in "holdout", each record's side a keyed hash of itself).
        A private child charges its parent's budget."""
        body = {"name": name, "kind": kind, "classes": classes, "fraction": fraction,
                "part": part, "declared_size": declared_size}
        return self._request(  # type: ignore[no-any-return]
            "POST", f"/v1/datasets/{dataset_id}/derive",
            json={k: v for k, v in body.items() if v is not None})

    def list_held_out(self, dataset_id: str) -> list[dict[str, Any]]:
        """``GET /v1/datasets/{id}/holdout`` (owner scope): the upload's held-out records,
        each ``{"index": <position in the upload>, "record_hash": <sha256 of its canonical
        content>}``, to reproduce an evaluation outside the platform."""
        body = self._request("GET", f"/v1/datasets/{dataset_id}/holdout")
        return list(body["items"])

    def delete_dataset(self, dataset_id: str) -> dict[str, Any]:
        """``DELETE /v1/datasets/{id}`` (owner scope): delete the stored data; the budget,
        its ledger entries and the record hashes remain."""
        return self._request(  # type: ignore[no-any-return]
            "DELETE", f"/v1/datasets/{dataset_id}")

    # -- models --------------------------------------------------------------------------
    def upload_model(self, path: Path | str, *, name: str,
                     metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Upload a diffusers model: a ``save_pretrained`` folder (tarred here), or its
        ``.tar`` or ``.zip`` (e.g. one :meth:`download_model` wrote)."""
        path = Path(path)
        meta = {"name": name, **(metadata or {})}
        with tempfile.TemporaryDirectory() as tmp:
            upload = _tar_folder(path, Path(tmp) / "model.tar") if path.is_dir() else path
            with upload.open("rb") as handle:
                return self._request(  # type: ignore[no-any-return]
                    "POST", "/v1/models", data={"metadata": json.dumps(meta)},
                    files={"file": (upload.name, handle, "application/x-tar")})

    def list_models(self) -> list[dict[str, Any]]:
        """The tenant's models (every page)."""
        return list(self._paged("/v1/models"))

    def get_model(self, model_id: str) -> dict[str, Any]:
        """One model."""
        return self._request("GET", f"/v1/models/{model_id}")  # type: ignore[no-any-return]

    def download_model(self, model_id: str, dest: Path | str, *,
                       on_chunk: Callable[[int, int | None], None] | None = None) -> Path:
        """Stream a model to ``dest`` as the zip of its diffusers folder + dpsynth_model.json
        (the format :meth:`upload_model` accepts); temp file + rename.

        Args:
            on_chunk: called with (bytes so far, total or None) after each chunk.

        Raises:
            DpsynthError: ``not_found``, or ``not_publishable`` for a model trained with an
                injected test generator.
        """
        return self._download(f"/v1/models/{model_id}/download", dest, on_chunk)

    # -- jobs ----------------------------------------------------------------------------
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

    def _paged(self, path: str, *, page_size: int = 50,
               **filters: Any) -> Iterator[dict[str, Any]]:
        """Items of a ``{items, next_cursor}`` listing, fetched lazily page by page."""
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size, **filters}
            if cursor:
                params["cursor"] = cursor
            page = self._request("GET", path, params=params)
            yield from _items(page)
            cursor = page.get("next_cursor") if isinstance(page, dict) else None
            if not cursor:
                return

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

    # -- evaluation reports (issue 5) ----------------------------------------------------
    def get_report(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}/report``: an evaluate job's ``report.json`` document
        (:class:`dpsynth_shared.evaluation.EvaluationReport`; its ``headline`` holds the
        numbers). A report on a private reference needs the owner scope (403 otherwise);
        409 while the job has no report yet."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/jobs/{job_id}/report")

    def download_report(self, job_id: str, dest: Path | str, format: str = "html", *,
                        on_chunk: Callable[[int, int | None], None] | None = None) -> Path:
        """Save an evaluate job's report to ``dest``: the self-contained HTML page
        (``format="html"``) or the JSON document (``format="json"``); temp file + rename.

        Raises:
            ValueError: for another format.
        """
        if format not in ("html", "json"):
            raise ValueError(f"format must be 'html' or 'json', not {format!r}")
        return self._download(f"/v1/jobs/{job_id}/report?format={format}", dest, on_chunk)

    # -- artifacts -----------------------------------------------------------------------
    def get_artifact(self, artifact_id: str) -> dict[str, Any]:
        """One artifact's metadata (kind, size, sha256...)."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/artifacts/{artifact_id}")

    def presign_artifact(self, artifact_id: str) -> dict[str, Any]:
        """A short-lived URL for a corpus: ``{url, expires_at}`` (corpora only)."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/artifacts/{artifact_id}/download", params={"presign": "true"})

    def download_artifact(self, artifact_id: str, dest: Path | str, *,
                          on_chunk: Callable[[int, int | None], None] | None = None) -> Path:
        """Stream an artifact to ``dest`` (temp file + rename); returns the path.

        Args:
            on_chunk: called with (bytes so far, total or None) after each chunk.
        """
        return self._download(f"/v1/artifacts/{artifact_id}/download", dest, on_chunk)

    def _download(self, url: str, dest: Path | str,
                  on_chunk: Callable[[int, int | None], None] | None) -> Path:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".download-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out, self._http.stream("GET", url) as response:
                raise_for_problem(response)
                total = response.headers.get("content-length")
                done = 0
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if on_chunk is not None:
                        on_chunk(done, int(total) if total else None)
            os.replace(tmp, dest)
        except httpx.TransportError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise unreachable(self.base_url, exc) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dest

    # -- ledger history and budget policies (issue 4) ------------------------------------
    def ledger_export(self, dataset_id: str, *, fmt: str = "json") -> Any:
        """``GET /v1/datasets/{id}/ledger``: the dataset's signed, hash-chained entries and
        the chain key (a dict), or with ``fmt="csv"`` the CSV text."""
        if fmt == "json":
            return self._request("GET", f"/v1/datasets/{dataset_id}/ledger")
        try:
            response = self._http.get(f"/v1/datasets/{dataset_id}/ledger",
                                      params={"format": fmt}, headers={"Accept": "text/csv"})
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        raise_for_problem(response)
        return response.text

    def ledger_verify(self, dataset_id: str) -> dict[str, Any]:
        """``GET /v1/datasets/{id}/ledger/verify``: the server-side verify report."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/datasets/{dataset_id}/ledger/verify")

    def ledger_recompute(self, dataset_id: str) -> dict[str, Any]:
        """``GET /v1/datasets/{id}/ledger/recompute``: charges and figures recomputed with
        the ledger's current accountant code (a report; nothing changes)."""
        return self._request(  # type: ignore[no-any-return]
            "GET", f"/v1/datasets/{dataset_id}/ledger/recompute")

    def update_budget(self, dataset_id: str, *, epsilon_limit: float | None = None,
                      warning_fraction: float | None = None) -> dict[str, Any]:
        """``PATCH /v1/datasets/{id}/budget``: lower the limit (never raised) and/or set the
        warning fraction; returns the budget view."""
        body = {k: v for k, v in {"epsilon_limit": epsilon_limit,
                                  "warning_fraction": warning_fraction}.items() if v is not None}
        return self._request(  # type: ignore[no-any-return]
            "PATCH", f"/v1/datasets/{dataset_id}/budget", json=body)

    def set_tenant_policy(self, tenant_id: str, *,
                          max_dataset_epsilon_limit: float | None) -> dict[str, Any]:
        """``PUT /v1/admin/tenants/{id}/policy`` (admin): the cap on any single dataset's
        limit (None clears it); lists the tenant's datasets above the new cap."""
        return self._request(  # type: ignore[no-any-return]
            "PUT", f"/v1/admin/tenants/{tenant_id}/policy",
            json={"max_dataset_epsilon_limit": max_dataset_epsilon_limit})

    def ledger_reconcile(self) -> dict[str, Any]:
        """``POST /v1/admin/ledger/reconcile`` (admin): after a ledger restore, re-charge what
        the ledger's database lost (its anchor log and the api's DP jobs); the report."""
        return self._request(  # type: ignore[no-any-return]
            "POST", "/v1/admin/ledger/reconcile")

    def ledger_anchor(self) -> dict[str, Any]:
        """``GET /v1/admin/ledger/anchor`` (admin): the ledger's head against its anchor."""
        return self._request(  # type: ignore[no-any-return]
            "GET", "/v1/admin/ledger/anchor")


def _retry_after(response: httpx.Response) -> float:
    """Seconds a 429 asks to wait (``Retry-After`` in seconds), capped; 1 when absent."""
    value = response.headers.get("retry-after", "1")
    seconds = float(value) if value.replace(".", "", 1).isdigit() else 1.0
    return min(seconds, RETRY_AFTER_CAP_S)


def _items(body: Any) -> list[dict[str, Any]]:
    """Lists may come bare or wrapped as ``{"items": [...]}``."""
    if isinstance(body, dict):
        return list(body.get("items", []))
    return list(body or [])


def _tar_folder(folder: Path, dest: Path) -> Path:
    """An uncompressed tar of ``folder``'s contents (the api's model upload format)."""
    with tarfile.open(dest, "w") as tar:
        for item in sorted(folder.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(folder)), recursive=False)
    return dest
