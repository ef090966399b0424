"""The dpsynth Python client: one method per REST endpoint, problem+json → DpsynthError.

Auth is always the ``Authorization: Bearer`` header; the key is never put in a URL.
Methods return the decoded JSON bodies (dicts) so the client keeps working while the api
grows new fields. :meth:`Client.from_env` finds the api as the CLI does
(:mod:`dpsynth_client.config`); datasets and jobs live in :mod:`dpsynth_client.datasets`
and :mod:`dpsynth_client.jobs`, the HTTP plumbing in :mod:`dpsynth_client.transport`.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx

from dpsynth_client.config import resolve_config
from dpsynth_client.corpus import Corpus, CorpusError, read_corpus, read_manifest
from dpsynth_client.datasets import DatasetsApi
from dpsynth_client.errors import ApiError
from dpsynth_client.jobs import TERMINAL_STATES, JobsApi, ProgressCallback
from dpsynth_client.transport import RETRY_AFTER_CAP_S, ChunkCallback

__all__ = ["RETRY_AFTER_CAP_S", "TERMINAL_STATES", "Client", "ProgressCallback"]


class Client(DatasetsApi, JobsApi):
    """A typed-enough wrapper over the dpsynth REST api.

    Args:
        base_url: the api's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: a key created by ``POST /v1/tenants`` or ``/v1/tenants/{id}/keys``.
        timeout: seconds for connect/read of each request (uploads and downloads stream).
        transport: an httpx transport (tests pass an in-process one).
        config: where the URL and key came from (set by :meth:`from_env`).

    ``Client.from_env()`` builds one from the same place the CLI does.
    """

    @classmethod
    def from_env(cls, home: Path | str | None = None, *, api_url: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> Client:
        """A client for the api the ``dpsynth`` CLI would use from the current folder.

        The URL and the key each come from, first match wins: ``api_url``/``api_key``,
        ``DPSYNTH_API_URL``/``DPSYNTH_API_KEY``, then the ``credentials.json`` of the
        platform's home: ``home``, ``DPSYNTH_HOME``, the nearest ``.dpsynth`` in this folder
        or a parent, else the platform last started with ``dpsynth up``
        (:mod:`dpsynth_client.config`). ``client.config`` says where each came from.

        Raises:
            NotConfigured: nothing gives a URL or a key; the message says where it looked
                and what to do.
        """
        cfg = resolve_config(api_url=api_url, api_key=api_key, env=os.environ, home=home)
        return cls(cfg.api_url, cfg.api_key, timeout=timeout, transport=transport, config=cfg)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                       on_chunk: ChunkCallback | None = None) -> Path:
        """Stream a model to ``dest`` as the zip of its diffusers folder + dpsynth_model.json
        (the format :meth:`upload_model` accepts); temp file + rename.

        Args:
            on_chunk: called with (bytes so far, total or None) after each chunk.

        Raises:
            DpsynthError: ``not_found``, or ``not_publishable`` for a model trained with an
                injected test generator.
        """
        return self._download(f"/v1/models/{model_id}/download", dest, on_chunk)

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
                          on_chunk: ChunkCallback | None = None) -> Path:
        """Stream an artifact to ``dest`` (temp file + rename); returns the path.

        Args:
            on_chunk: called with (bytes so far, total or None) after each chunk.
        """
        return self._download(f"/v1/artifacts/{artifact_id}/download", dest, on_chunk)

    def download_corpus(self, corpus: str | dict[str, Any], dest: Path | str | None = None, *,
                        class_names: list[str] | None = None,
                        on_chunk: ChunkCallback | None = None) -> Corpus:
        """Download a synthetic corpus and return it as arrays.

        Args:
            corpus: the corpus's artifact id (``art_...``), or its generate job: the job's
                id (``job_...``) or document (what :meth:`submit_and_wait` returns).
            dest: where to keep the zip too (default: a temporary file, removed once read).
            class_names: the class list labels index; default: the class names of the
                model that sampled the corpus (its ``info.class_names``, the training
                dataset's order), else the manifest's class names sorted.
            on_chunk: called with (bytes so far, total or None) during the download.

        Returns:
            :class:`~dpsynth_client.corpus.Corpus`: ``images`` uint8 [N, H, W, C],
            ``labels`` int64 [N], ``class_names`` and the ``manifest``.

        Raises:
            DpsynthError: ``not_found`` and the other download errors.
            CorpusError: the job made no corpus, or the artifact is not a corpus zip.
        """
        artifact_id = self._corpus_artifact_id(corpus)
        with tempfile.TemporaryDirectory(prefix="dpsynth-corpus-") as tmp:
            path = self.download_artifact(artifact_id, Path(dest or Path(tmp) / "corpus.zip"),
                                          on_chunk=on_chunk)
            if class_names is None:
                class_names = self._model_class_names(read_manifest(path))
            return read_corpus(path, class_names)

    def _corpus_artifact_id(self, corpus: str | dict[str, Any]) -> str:
        """The artifact id itself, or the ``corpus`` artifact a generate job lists."""
        if isinstance(corpus, str) and not corpus.startswith("job_"):
            return corpus
        job = self.get_job(corpus) if isinstance(corpus, str) else corpus
        if isinstance(corpus, dict) and "artifacts" not in job:
            job = self.get_job(str(job["job_id"]))
        for artifact in job.get("artifacts") or []:
            if artifact.get("kind") == "corpus":
                return str(artifact["artifact_id"])
        raise CorpusError(f"job {job.get('job_id')} ({job.get('type')}, {job.get('state')}) "
                          "has no corpus artifact: a generate job lists one once it succeeded")

    def _model_class_names(self, manifest: dict[str, Any]) -> list[str] | None:
        """The class names of the corpus's model when the api still shows it and they name
        every class of the corpus; None otherwise (the corpus's own names are used)."""
        model_id = manifest.get("model_id")
        if not isinstance(model_id, str):
            return None
        try:
            names = self.get_model(model_id).get("info", {}).get("class_names")
        except ApiError:
            return None
        counts = manifest.get("counts") or {}
        if not isinstance(names, list) or not set(map(str, counts)) <= set(map(str, names)):
            return None
        return [str(name) for name in names]

    # -- budget policies and ledger administration (admin) --------------------------------
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


def _tar_folder(folder: Path, dest: Path) -> Path:
    """An uncompressed tar of ``folder``'s contents (the api's model upload format)."""
    with tarfile.open(dest, "w") as tar:
        for item in sorted(folder.rglob("*")):
            tar.add(item, arcname=str(item.relative_to(folder)), recursive=False)
    return dest
