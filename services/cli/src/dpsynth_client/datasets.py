"""Datasets, their budgets and their ledger history: the dataset half of the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from dpsynth_client.errors import raise_for_problem
from dpsynth_client.transport import ApiTransport


class DatasetsApi(ApiTransport):
    """``/v1/datasets``: uploads, derived datasets, held-out records, budgets, ledger."""

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
                       on_duplicate: str | None = None, holdout_from: str | None = None,
                       label_column: str | None = None) -> dict[str, Any]:
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
        ``holdout_from="test"`` (or ``"validation"``): an upload of Hugging Face split folders
        (``train/<label>/…``, ``test/<label>/…``) holds out that split, as its owner chose it;
        ``label_column`` names the label column of a ``metadata.csv``/``.jsonl`` (default
        ``label``). docs/datasets.md lists every accepted layout.
        """
        metadata = {"name": name, "visibility": visibility, "epsilon_limit": epsilon_limit,
                    "delta": delta, "label_domain": label_domain, "declared_size": declared_size,
                    "class_sizes": class_sizes, "on_overlap": on_overlap,
                    "privacy_unit": privacy_unit, "subject_column": subject_column,
                    "holdout_fraction": holdout_fraction, "holdout_key": holdout_key,
                    "size_epsilon": size_epsilon, "partitions_disjoint": partitions_disjoint,
                    "holdout_from": holdout_from, "label_column": label_column}
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
            raise self._unreachable(exc) from exc
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
