"""The HTTP plumbing every part of :class:`dpsynth_client.Client` shares.

Auth is always the ``Authorization: Bearer`` header; the key is never put in a URL. A POST
carries one ``Idempotency-Key`` kept by its retry, so the api runs it at most once; a 429
is retried once, after ``Retry-After`` (capped). Problem+json answers become
:class:`~dpsynth_client.errors.ApiError`.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from dpsynth_client.config import ClientConfig
from dpsynth_client.errors import ApiError, raise_for_problem, unreachable

RETRY_AFTER_CAP_S = 10.0  # a 429 is retried once, after Retry-After but never longer
ChunkCallback = Callable[[int, int | None], None]


class ApiTransport:
    """The connection pool, requests, paging and streamed downloads.

    Args:
        base_url: the api's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: a key created by ``POST /v1/tenants`` or ``/v1/tenants/{id}/keys``.
        timeout: seconds for connect/read of each request (uploads and downloads stream).
        transport: an httpx transport (tests pass an in-process one).
        config: where the URL and key came from (:meth:`Client.from_env` sets it); an
            unreachable api's error then names the credentials file and its platform.
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None,
                 config: ClientConfig | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        )

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

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
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: Exception) -> ApiError:
        hint = ""
        cfg = self.config
        if cfg is not None and cfg.home is not None and cfg.url_source.endswith(".json"):
            hint = (f"the URL is from {cfg.url_source}: is that platform running? "
                    f"`dpsynth status --home {cfg.home}` tells, `dpsynth up --home "
                    f"{cfg.home}` starts it")
        return unreachable(self.base_url, exc, hint)

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

    def _download(self, url: str, dest: Path | str, on_chunk: ChunkCallback | None) -> Path:
        """Stream ``url`` to ``dest`` through a temporary file renamed at the end."""
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
            raise self._unreachable(exc) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dest


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
