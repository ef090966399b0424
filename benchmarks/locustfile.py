"""Locust users of the service-load benchmark (``benchmarks/service_load.py`` drives them).

Run headless by ``service_load.py``, one user class per run::

    locust -f benchmarks/locustfile.py --headless -u 32 -r 32 -t 30s --csv PREFIX \
        --host http://127.0.0.1:8000 SubmitFinetuneUser

Configuration comes from the environment (``service_load.py`` sets it; ids of objects it
created on the platform beforehand):

- ``BENCH_API_KEY``: the tenant key for the api; ``BENCH_LEDGER_TOKEN`` /
  ``BENCH_LEDGER_WORKER_TOKEN``: the ledger's service tokens of the api and of the workers.
- ``BENCH_SPECS``: JSON list of job specs; a submitting user picks one at random per request.
- ``BENCH_RESERVE``: JSON body template of ``POST /v1/reservations`` (``job_id`` is filled in).
- ``BENCH_LIFECYCLE_FRACTION``: share of accepted reservations that go on like a job (read
  grant, a lease of half the steps, close), so the budget has committed and reserved RDP.
- ``BENCH_STOP_AFTER_REFUSALS``: the ledger run stops once this many refusals were answered.
- ``BENCH_RAW_OUT``: where each request's (kind, start, latency, status, code) goes at exit.

Why own records next to locust's CSV: locust's percentiles are bucketed (10 ms above 100 ms,
100 ms above 1 s) and it has no notion of "accepted vs refused" for a 409 that is a correct
answer; the benchmark computes exact percentiles and rates from these records.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from typing import Any

import gevent
from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser

RECORDS: list[tuple[str, float, float, int, str]] = []
"""(kind, start epoch s, latency s, HTTP status, problem code or "") of every request."""
_REFUSALS = {"n": 0}


def _env_json(name: str, default: Any) -> Any:
    raw = os.environ.get(name)
    return json.loads(raw) if raw else default


def _problem_code(response: Any) -> str:
    try:
        body = json.loads(response.text or "{}")
    except (ValueError, TypeError):
        return ""
    return str(body.get("code", "")) if isinstance(body, dict) else ""


class _BenchUser(FastHttpUser):  # type: ignore[misc]
    """Common plumbing: no think time (closed loop: each user waits for its answer, then
    asks again), long timeouts (an admission may queue behind others for tens of seconds)."""

    abstract = True
    wait_time = constant(0)
    network_timeout = 300.0
    connection_timeout = 30.0

    def _call(self, kind: str, method: str, path: str, *, ok: tuple[int, ...],
              expected: tuple[int, ...] = (), token: str | None = None,
              **kwargs: Any) -> Any:
        """One timed request; ``ok`` and ``expected`` (e.g. a 409 refusal) count as answered
        correctly, anything else is a locust failure."""
        headers = {"Authorization": f"Bearer {token or os.environ['BENCH_API_KEY']}"}
        t0 = time.time()
        start = time.perf_counter()
        with self.client.request(method, path, name=kind, headers=headers,
                                 catch_response=True, **kwargs) as response:
            latency = time.perf_counter() - start
            status = int(response.status_code or 0)
            code = _problem_code(response) if status >= 400 else ""
            if status in ok or status in expected:
                response.success()
            else:
                response.failure(f"{status} {code or (response.text or '')[:200]}")
            RECORDS.append((kind, t0, latency, status, code))
            return response


class HealthzUser(_BenchUser):
    """``GET /healthz``: the cheapest request the api serves; the same-run baseline."""

    @task
    def healthz(self) -> None:
        self._call("healthz", "GET", "/healthz", ok=(200,))


class _SubmitUser(_BenchUser):
    abstract = True
    dry_run = False

    @task
    def submit(self) -> None:
        spec = random.choice(_env_json("BENCH_SPECS", []))
        path = "/v1/jobs?dry_run=true" if self.dry_run else "/v1/jobs"
        kind = f"submit_{spec['type']}" + ("_dry_run" if self.dry_run else "")
        self._call(kind, "POST", path, ok=(200, 201), json=spec)


class SubmitUser(_SubmitUser):
    """``POST /v1/jobs``: the job row is inserted ``queued`` and the task sent to Redis; with
    no worker running, nothing consumes it (the cost measured is the api's, not training's)."""


class DryRunUser(_SubmitUser):
    """``POST /v1/jobs?dry_run=true``: validation and the ledger's plan, nothing written."""

    dry_run = True


class LedgerReserveUser(_BenchUser):
    """``POST /v1/reservations`` straight at the ledger, all users against ONE budget, until it
    is exhausted. Part of the accepted reservations go on like a job does."""

    @task
    def reserve(self) -> None:
        body = {**_env_json("BENCH_RESERVE", {}), "job_id": f"job_{uuid.uuid4().hex}"}
        token = os.environ["BENCH_LEDGER_TOKEN"]
        r = self._call("reserve", "POST", "/v1/reservations", ok=(201,), expected=(409,),
                       token=token, json=body)
        if r.status_code == 409:
            _REFUSALS["n"] += 1
            if _REFUSALS["n"] == int(os.environ.get("BENCH_STOP_AFTER_REFUSALS", "50")):
                # quit from a greenlet of its own: runner.quit() kills every user greenlet,
                # this one included, and would never finish if called from here
                gevent.spawn(self.environment.runner.quit)
            return
        if r.status_code != 201:
            return
        if random.random() < float(os.environ.get("BENCH_LIFECYCLE_FRACTION", "0.5")):
            self._job_lifecycle(json.loads(r.text), int(body["steps"]))

    def _job_lifecycle(self, reservation: dict[str, Any], steps: int) -> None:
        rid = reservation["reservation_id"]
        worker = os.environ["BENCH_LEDGER_WORKER_TOKEN"]
        base = f"/v1/reservations/{rid}"
        self._call("read_grant", "POST", f"{base}/read-grants", ok=(200, 201), token=worker,
                   json={"attempt": 1, "worker_id": "bench"})
        self._call("lease", "POST", f"{base}/leases", ok=(201,), token=worker,
                   json={"attempt": 1, "start_step": 0, "steps": max(1, steps // 2)})
        self._call("close", "POST", f"{base}/close", ok=(200,), token=worker,
                   json={"outcome": "succeeded"})


@events.quitting.add_listener  # type: ignore[misc]
def _write_records(environment: Any, **_: Any) -> None:
    out = os.environ.get("BENCH_RAW_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(RECORDS, fh)
