"""Issue 14, item 1: one plan must not stop the ledger for every tenant.

Against a real ledger server process (``python -m dpsynth_ledger``) on real PostgreSQL:
out-of-bounds plans are refused at once with 422 ``plan_too_large``; another tenant's budget
view and admission are answered within a second while the heaviest admissible plan runs;
the tight figure is computed in the background and converges to the direct PLD figure,
"as of" the right number of events; a calibrated σ is cached, identical to calibration's,
and shared across processes; a request beyond the heavy slots is 503 ``ledger_busy``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from dpsynth_ledger.accounting import calibrate_noise_multiplier, pld, pld_epsilon
from dpsynth_ledger.app import create_app
from dpsynth_ledger.heavy import HeavyWork, shape_key
from dpsynth_ledger.migrate import upgrade
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.grants import generate_signing_key
from dpsynth_shared.plan_limits import PlanLimits
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from tests.support.servers import free_port

from .conftest import AUTH, TOKEN, make_settings

BIG = 10**9  # MAX_DECLARED_SIZE: q = 1e-6 at batch 1,000, the most expensive rate measured


@pytest.fixture(scope="module")
def ledger(pg: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A real ledger process (background tight figures, no inline computation)."""
    url = pg.url(pg.create_database())
    work = tmp_path_factory.mktemp("ledger-heavy")
    port = free_port()
    env = {**os.environ,
           "DPSYNTH_LEDGER_DATABASE__URL": url,
           "DPSYNTH_LEDGER_SERVICE_TOKENS": json.dumps([TOKEN]),
           "DPSYNTH_LEDGER_GRANT_SIGNING_KEY": generate_signing_key(),
           "DPSYNTH_LEDGER_CHAIN_SIGNING_KEY": generate_signing_key(),
           "DPSYNTH_LEDGER_ANCHOR__PATH": str(work / "anchor.jsonl"),
           "DPSYNTH_LEDGER_PORT": str(port), "DPSYNTH_LEDGER_TIGHT_POLL_S": "0.1"}
    with (work / "ledger.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dpsynth_ledger"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (work / "ledger.log").read_text()[-2000:]
            time.sleep(0.2)
        with httpx.Client(base_url=base, headers=AUTH, timeout=120) as client:
            client.database_url = url  # type: ignore[attr-defined]
            yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _budget(client: httpx.Client, dataset_id: str, tenant: str, *, size: int = 60_000,
            delta: float = 1e-6, limit: float = 8.0) -> None:
    r = client.post("/v1/budgets", json={"dataset_id": dataset_id, "tenant_id": tenant,
                                         "epsilon_limit": limit, "delta": delta,
                                         "declared_size": size})
    assert r.status_code == 201, r.text


def _timed(call: Any) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = call()
    return response, time.monotonic() - start


def test_out_of_bounds_plans_are_refused_at_once(ledger: httpx.Client) -> None:
    """The attack's plan (batch 1, 10,000 epochs of N̂) is refused before any accounting."""
    _budget(ledger, "ds_attack", "ten_attacker", size=BIG, delta=1e-10)
    attack = {"dataset_id": "ds_attack", "target_epsilon": 1.0, "expected_batch_size": 1,
              "steps": 10_000 * BIG}
    for path, body in (("/v1/plans", attack),
                       ("/v1/reservations", {**attack, "job_id": "job_attack",
                                             "dry_run": True}),
                       ("/v1/plans", {"dataset_id": "ds_attack", "target_epsilon": 1.0,
                                      "expected_batch_size": 1000,
                                      "steps": PlanLimits().max_steps + 1})):
        r, elapsed = _timed(lambda p=path, b=body: ledger.post(p, json=b))
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        problem = r.json()
        assert problem["code"] == "plan_too_large" and problem["bound"] == "max_steps"
        assert problem["limit"] == PlanLimits().max_steps and problem["value"] == body["steps"]
        assert elapsed < 0.5


def test_other_tenants_are_answered_while_the_heaviest_plan_runs(
        ledger: httpx.Client) -> None:
    _budget(ledger, "ds_heavy", "ten_heavy", size=BIG, delta=1e-10, limit=100.0)
    _budget(ledger, "ds_calm", "ten_calm")
    calm = {"dataset_id": "ds_calm", "target_epsilon": 0.5, "expected_batch_size": 256,
            "steps": 200}
    assert ledger.post("/v1/reservations", json={**calm, "job_id": "job_calm_0"}) \
        .status_code == 201  # this shape is calibrated (and cached) once, before
    # the heaviest admissible plan: max_steps at q = 1e-6 and a large target (~5 s of CPU
    # for the calibration alone, measured), plus its report figures
    heaviest = {"dataset_id": "ds_heavy", "target_epsilon": 99.0, "expected_batch_size": 1000,
                "steps": PlanLimits().max_steps}
    result: dict[str, Any] = {}

    def run_heavy() -> None:
        result["response"], result["elapsed"] = _timed(
            lambda: ledger.post("/v1/plans", json=heaviest))

    heavy = threading.Thread(target=run_heavy)
    heavy.start()
    time.sleep(0.5)  # the plan is calibrating now
    view, view_s = _timed(lambda: ledger.get("/v1/budgets/ds_calm"))
    admission, admission_s = _timed(lambda: ledger.post(
        "/v1/reservations", json={**calm, "job_id": "job_calm_1"}))
    still_running = heavy.is_alive()
    heavy.join()
    assert view.status_code == 200 and admission.status_code == 201, admission.text
    assert still_running, f"the heavy plan ended first ({result['elapsed']:.2f} s)"
    assert view_s < 1.0 and admission_s < 1.0, (view_s, admission_s)
    assert result["response"].status_code == 200, result["response"].text
    print(f"heaviest plan {result['elapsed']:.2f} s; view {view_s:.3f} s, "
          f"admission {admission_s:.3f} s")


def _lease(client: httpx.Client, job: str, steps: int, *, attempt: int = 1) -> dict[str, Any]:
    r = client.post("/v1/reservations", json={
        "job_id": job, "dataset_id": "ds_tight", "target_epsilon": 1.0,
        "expected_batch_size": 600, "steps": steps})
    assert r.status_code == 201, r.text
    res = r.json()
    rid = res["reservation_id"]
    assert client.post(f"/v1/reservations/{rid}/read-grants",
                       json={"attempt": attempt, "worker_id": "w"}).status_code == 201
    assert client.post(f"/v1/reservations/{rid}/leases", json={
        "attempt": attempt, "start_step": 0, "steps": steps}).status_code == 201
    return res["event"]  # type: ignore[no-any-return]


def _settled(client: httpx.Client, dataset_id: str, events: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        view = client.get(f"/v1/budgets/{dataset_id}").json()
        if view["dataset_tight_epsilon_as_of"] == events and \
                not view["dataset_tight_epsilon_pending"]:
            return view  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


def test_tight_figure_is_computed_in_the_background_as_of_its_events(
        ledger: httpx.Client) -> None:
    _budget(ledger, "ds_tight", "ten_tight")
    fresh = ledger.get("/v1/budgets/ds_tight").json()
    assert (fresh["dataset_tight_epsilon"], fresh["dataset_tight_epsilon_as_of"],
            fresh["dataset_tight_epsilon_pending"]) == (0.0, 0, False)
    first = _lease(ledger, "job_t1", 300)
    one = _settled(ledger, "ds_tight", 1)
    second = _lease(ledger, "job_t2", 100)
    two = _settled(ledger, "ds_tight", 2)
    runs = [DpSgdEvent(noise_multiplier=e["noise_multiplier"], sample_rate=e["sample_rate"],
                       steps=e["steps"]) for e in (first, second)]
    # what the synchronous code computed: the PLD of the realised sequence, directly
    assert one["dataset_tight_epsilon"] == pld_epsilon(runs[:1], 1e-6, 1e-3)
    assert two["dataset_tight_epsilon"] == pld_epsilon(runs, 1e-6, 1e-3)
    assert two["dataset_tight_epsilon_label"].endswith("not a guarantee under adaptive use")
    leases = [c for c in two["history"] if c["kind"] == "lease_granted"]
    assert [c["dataset_tight_epsilon_after"] for c in leases] == \
        [one["dataset_tight_epsilon"], two["dataset_tight_epsilon"]]


def test_calibration_is_cached_identically_and_shared_across_processes(
        ledger: httpx.Client) -> None:
    """The ledger process calibrates a shape; this process finds the identical σ in the
    shared table, and uses it without calibrating."""
    _budget(ledger, "ds_cache", "ten_cache")
    shape = {"dataset_id": "ds_cache", "target_epsilon": 1.2345, "expected_batch_size": 300,
             "steps": 1500}
    planned = ledger.post("/v1/plans", json=shape)
    assert planned.status_code == 200, planned.text
    sigma = planned.json()["event"]["noise_multiplier"]
    q = 300 / 60_000
    assert sigma == calibrate_noise_multiplier(1.2345, q, 1500, 1e-6, 1e-3, "add_remove")
    engine = create_engine(ledger.database_url)  # type: ignore[attr-defined]
    try:
        heavy = HeavyWork(sessionmaker(engine), limits=PlanLimits(), concurrency=1, wait_s=0,
                          discretization=1e-3, max_composition=8, max_waiting=0)
        key = shape_key("dp_sgd", 1.2345, q, 1500, 1e-6, "add_remove", 1e-3)
        assert heavy._cached(key) == sigma  # the row the other process wrote
        pld._calibrate.cache_clear()
        assert heavy.noise_multiplier(1.2345, q, 1500, 1e-6, "add_remove") == sigma
        assert pld._calibrate.cache_info().misses == 0  # served by the table, not computed
    finally:
        engine.dispose()


def test_a_heavy_request_beyond_the_slots_is_503_with_retry_after(database_url: str) -> None:
    settings: LedgerSettings = make_settings(database_url, heavy_concurrency=1,
                                             heavy_wait_s=0.0)
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        r = client.post("/v1/budgets", json={"dataset_id": "ds_busy", "tenant_id": "t",
                                             "epsilon_limit": 8.0, "delta": 1e-6,
                                             "declared_size": 60_000})
        assert r.status_code == 201, r.text
        with client.app.state.ctx.heavy.slot("the test"):  # type: ignore[attr-defined]
            busy = client.post("/v1/plans", json={
                "dataset_id": "ds_busy", "target_epsilon": 0.777, "expected_batch_size": 128,
                "steps": 333})
        assert busy.status_code == 503 and busy.json()["code"] == "ledger_busy"
        assert busy.headers["retry-after"] == "2"
        assert client.get("/v1/budgets/ds_busy").status_code == 200  # needs no slot
        assert client.post("/v1/plans", json={  # the slot is free again
            "dataset_id": "ds_busy", "target_epsilon": 0.777, "expected_batch_size": 128,
            "steps": 333}).status_code == 200


def test_plan_limits_are_settings(database_url: str) -> None:
    settings = make_settings(database_url, plan_limits=PlanLimits(max_runs=2))
    upgrade(settings)
    with TestClient(create_app(settings), headers=AUTH) as client:
        assert client.post("/v1/budgets", json={
            "dataset_id": "ds_lim", "tenant_id": "t", "epsilon_limit": 8.0, "delta": 1e-6,
            "declared_size": 60_000, "partitions": ["a", "b", "c"],
            "class_sizes": {"a": 20_000, "b": 20_000, "c": 20_000}}).status_code == 201
        shape = {"expected_batch_size": 100, "steps": 10}
        r = client.post("/v1/plans", json={"dataset_id": "ds_lim", "target_epsilon": 1.0,
                                           "per_label": {c: shape for c in "abc"}})
        assert r.status_code == 422 and r.json()["code"] == "plan_too_large"
        assert (r.json()["bound"], r.json()["limit"], r.json()["value"]) == ("max_runs", 2, 3)
