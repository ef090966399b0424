"""An in-process fake of the dpsynth api (an httpx transport), for client and CLI tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, code: str, detail: str, **ext: Any) -> httpx.Response:
    body = {"type": f"https://dpsynth.dev/problems/{code}", "title": code, "status": status,
            "detail": detail, "code": code, **ext}
    return httpx.Response(status, content=json.dumps(body).encode(),
                          headers={"content-type": "application/problem+json"})


@dataclass
class FakeApi:
    """Routes ``(method, path)`` to handlers and records every request it saw."""

    key: str = "dps_test_key"
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def route(self, method: str, path: str, handler: Handler | Any) -> None:
        if not callable(handler):
            body = handler
            handler = lambda _req: httpx.Response(200, json=body)  # noqa: E731
        self.routes[(method, path)] = handler

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return problem(401, "unauthenticated", "bad key")
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return problem(404, "not_found", f"no route {request.method} {request.url.path}")
        return handler(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


# Bodies with every field the api's response schemas have (JobOut, DatasetOut, ModelOut),
# so a CLI test reads the names the real api sends; tests/unit/cli/test_cli_outputs.py
# validates them against those schemas.
CREATED_AT = "2026-11-26T09:00:00Z"


def job_body(job_id: str = "job_1", type_: str = "finetune", state: str = "queued",
             **fields: Any) -> dict[str, Any]:
    """A ``JobOut`` body; ``fields`` override (e.g. ``result``, ``artifacts``, ``model_id``)."""
    body: dict[str, Any] = {
        "job_id": job_id, "tenant_id": "ten_1", "type": type_, "state": state, "attempt": 1,
        "drained_attempts": 0, "spec": {"type": type_}, "dataset_id": None, "model_id": None,
        "progress": {"step": 0, "total": 0, "epsilon_so_far": None, "eta_s": None,
                     "message": None},
        "privacy": None, "result": {}, "artifacts": [], "error": None, "heartbeat_at": None,
        "created_at": CREATED_AT, "updated_at": CREATED_AT, "started_at": None,
        "finished_at": None, "name": None}
    body.update(fields)
    return body


def dataset_body(dataset_id: str = "ds_1", **fields: Any) -> dict[str, Any]:
    """A ``DatasetOut`` body of a private dataset, as its owner sees it."""
    body: dict[str, Any] = {
        "dataset_id": dataset_id, "tenant_id": "ten_1", "name": "digits-private",
        "visibility": "private", "declared_size": 1100, "declared_size_source": "declared",
        "size_release": None, "true_size": 808, "num_classes": 10, "image_shape": [8, 8, 1],
        "has_masks": False, "delta": 1e-6, "epsilon_limit": 8.0, "neighbouring":
        "add_remove", "class_sizes_source": None, "declared_public_by": None,
        "budget_id": dataset_id, "parent_id": None, "derivation": None, "deleted_at": None,
        "privacy_unit": "image", "subject_count": None, "partitions_disjoint": True,
        "warning_fraction": 0.8, "holdout_fraction": 0.25, "holdout_rule": "keyed_hash_v1",
        "holdout_key_source": "platform", "holdout_size": 270, "source_format": "image_zip",
        "sha256": "ab" * 32, "size_bytes": 1234, "created_at": CREATED_AT,
        "class_names": [str(i) for i in range(10)], "class_counts": None,
        "class_sizes": None}
    body.update(fields)
    return body


def model_body(model_id: str = "mdl_1", **fields: Any) -> dict[str, Any]:
    """A ``ModelOut`` body of an uploaded, non-DP model."""
    body: dict[str, Any] = {
        "model_id": model_id, "tenant_id": "ten_1", "name": "base", "source": "upload",
        "dataset_id": None, "job_ids": [], "produced_by_job_id": None, "dp": False,
        "job_epsilon": None, "job_epsilon_label": None, "dataset_epsilon_spent": None,
        "delta": None, "rng": None, "publishable": True, "info": {}, "sha256": "cd" * 32,
        "size_bytes": 4321, "created_at": CREATED_AT}
    body.update(fields)
    return body


def use_fake_api(monkeypatch: Any) -> FakeApi:
    """A :class:`FakeApi` that every CLI command of the test talks to (the CLI's client is
    built on the fake's transport)."""
    from dpsynth_cli import common
    from dpsynth_client import Client

    fake = FakeApi()
    monkeypatch.setattr(common.CliState, "client",
                        lambda self: Client("http://api.test", fake.key,
                                            transport=fake.transport()))
    return fake
