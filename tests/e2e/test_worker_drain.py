"""Draining a worker with SIGTERM, as Kubernetes and compose stop it, on the whole platform.

A DP finetune is mid-training when its worker process gets SIGTERM (to the process only,
as a container runtime sends it to PID 1). The worker must stop at a step boundary, upload a
checkpoint, end its step lease at the ledger (its granted steps stay charged: ending it only
spares the next attempt the wait for its expiry), propose ``interrupted`` and exit 0 by
itself. A new worker then resumes from that checkpoint and finishes the planned steps; the
dataset is charged for every granted step and for nothing more.

The drain times (SIGTERM → exit) are printed with where they went (run with ``-s``): the
figures behind the workers' ``terminationGracePeriodSeconds`` and ``stop_grace_period``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from dpsynth_client import Client
from dpsynth_shared.settings import ObjectStoreSettings
from dpsynth_shared.stores.s3 import S3Store

from tests.e2e.conftest import finetune_spec, make_platform
from tests.e2e.ledger_replay import independent_rdp, ledger_entries, verify_chain
from tests.e2e.test_charging import (  # noqa: F401  (base_model is a fixture)
    base_model,
    granted_steps,
    private_dataset,
    reservation_of,
)
from tests.support.platform import ServicePlatform

#: SIGTERM → exit allowed here. The tiny model drains in 1.5–8 s on 2 shared cores (one
#: step, a 4.5 MB checkpoint, a few HTTP calls, the interpreter's exit); the bound only
#: catches a worker that does not drain at all (waiting for the task's end, a hung upload).
DRAIN_BOUND_S = 60.0
#: Leased (and checkpointed) in chunks of this many steps, so SIGTERM usually lands inside
#: a lease and leaves granted steps unrun.
CHECKPOINT_EVERY = 5
#: The ledger's step-lease TTL here. conftest's 4 s is shorter than one 5-step lease takes
#: on a loaded CI machine, so a lease could lapse before SIGTERM ends it; "ended, not
#: expired" needs a TTL above a lease's running time (the api's heartbeat TTL stays 4 s).
LEDGER_LEASE_TTL_S = 120
#: Attempts 1 and 2 are drained, attempt 3 finishes (FAST_ENV allows 3 attempts).
DRAINS = 2


@pytest.fixture(scope="module")
def platform(tmp_path_factory, pg, redis_url, s3_endpoint) -> Iterator[ServicePlatform]:
    p = make_platform(tmp_path_factory.mktemp("platform"), pg, redis_url, s3_endpoint,
                      workers=1,
                      extra_env={"DPSYNTH_LEDGER_LEASE_TTL_S": str(LEDGER_LEASE_TTL_S)})
    yield p
    p.stop()


def _records(text: str) -> list[dict[str, Any]]:
    """The log's JSON lines (Celery's own banner and shutdown notices are plain text)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _log(platform: ServicePlatform, name: str) -> list[dict[str, Any]]:
    return _records((platform.workdir / f"{name}.log").read_text(errors="replace"))


def _wait_running_past(client: Client, job_id: str, attempt: int, step: int,
                       timeout: float = 300) -> dict:
    """Wait until ``attempt`` reports progress beyond ``step`` (it is mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        assert job["state"] not in {"succeeded", "failed", "cancelled"}, job
        if (job["attempt"] == attempt and job["state"] == "running"
                and (job.get("progress") or {}).get("step", 0) > step):
            return job
        time.sleep(0.1)
    raise TimeoutError(f"attempt {attempt} of {job_id} made no progress past step {step}")


def _drain(proc: subprocess.Popen[bytes], client: Client, job_id: str
           ) -> tuple[float, float, int, set[tuple[str, int]]]:
    """SIGTERM the worker's process; return (seconds to exit, wall-clock time of the
    signal, exit code, job states seen)."""
    seen: set[tuple[str, int]] = set()
    started, sent_at = time.monotonic(), time.time()
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None:
        if time.monotonic() - started > DRAIN_BOUND_S:
            proc.kill()
            pytest.fail(f"the worker did not exit within {DRAIN_BOUND_S}s of SIGTERM")
        job = client.get_job(job_id)
        seen.add((job["state"], job["attempt"]))
        time.sleep(0.05)
    return time.monotonic() - started, sent_at, proc.returncode, seen


def _ts(entry: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(entry["at"])


def test_sigterm_drains_at_a_step_boundary_and_the_next_worker_resumes(
        platform: ServicePlatform, client: Client, base_model: str, tmp_path) -> None:  # noqa: F811
    ds = private_dataset(client, tmp_path, limit=10.0)
    dataset_id = ds["dataset_id"]
    # ~12 steps: long enough to be mid-training twice, short on 2 shared CPU cores
    job = client.submit_job(finetune_spec(dataset_id, base_model, expected_batch_size=8,
                                          epochs=0.5, checkpoint_every=CHECKPOINT_EVERY))
    job_id = job["job_id"]
    total = job["privacy"]["steps"]
    store = S3Store(ObjectStoreSettings(kind="s3", endpoint=platform.s3_endpoint or "",
                                        access_key="dpsynth-e2e-access",
                                        secret_key="dpsynth-e2e-secret-key",
                                        bucket=platform.bucket))
    drains: list[float] = []
    resumed_from = 0
    spent_before = 0.0
    for attempt in range(1, DRAINS + 1):
        worker = f"worker-{attempt - 1}"
        _wait_running_past(client, job_id, attempt, resumed_from)
        spent_at_signal = client.get_budget(dataset_id)["rdp_spent"]
        seconds, sent_at, code, seen = _drain(platform.procs[worker], client, job_id)
        drains.append(seconds)
        assert code == 0, platform.log(worker)

        # The worker's log: stopped at a step boundary, checkpointed, ended its lease; every
        # line of the attempt (its heartbeat thread's too) carries the job id.
        lines = _log(platform, worker)
        first = next(i for i, r in enumerate(lines) if r["msg"] == "job claimed")
        last = next(i for i, r in enumerate(lines) if r["msg"] == "attempt finished")
        assert all(r.get("job_id") == job_id for r in lines[first:last + 1]
                   if not r["logger"].startswith("celery")), lines[first:last + 1]
        records = [r for r in lines if r.get("job_id") == job_id]
        assert all(r["service"] == "worker" for r in records)
        msgs = [r["msg"] for r in records]
        stop = next(r for r in records if r["msg"] == "training stopped at a step boundary")
        step = stop["step"]
        assert resumed_from < step < total
        ckpt = [r for r in records if r["msg"] == "checkpoint uploaded"]
        assert ckpt[-1]["step"] == step
        assert msgs.index("worker shutting down; stopping the running job at a step "
                          "boundary") < msgs.index("training stopped at a step boundary")
        assert "lease ended early; its steps stay charged" in msgs
        assert "transition proposal refused" not in msgs  # the api took "interrupted"
        finished = next(r for r in records if r["msg"] == "attempt finished")
        assert (finished["attempt"], finished["outcome"]) == (attempt, "interrupted")
        # ... and its checkpoint is in the object store (what the next attempt resumes).
        stat = store.stat(f"checkpoints/{job_id}/step-{step:08d}.tar")
        assert stat is not None and stat.size > 0

        # The ledger: the attempt's last lease was ended (not left to expire); every step
        # it was granted stays charged, run or not.
        entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, dataset_id)
        mine = [e for e in entries if e["payload"].get("attempt") == attempt]
        leases = [e for e in mine if e["kind"] == "lease_granted"]
        ended = [e for e in mine if e["kind"] == "lease_ended"]
        assert [e["payload"]["lease_id"] for e in ended] == [leases[-1]["payload"]["lease_id"]]
        assert (_ts(ended[0]) - _ts(leases[-1])).total_seconds() < LEDGER_LEASE_TTL_S
        assert ended[0]["payload"]["steps"] == leases[-1]["payload"]["steps"]
        leased_to = max(e["payload"]["start_step"] + e["payload"]["steps"] for e in leases)
        assert leased_to >= step
        budget = client.get_budget(dataset_id)
        assert budget["rdp_spent"] >= spent_at_signal >= spent_before
        ev = next(e["payload"]["event"] for e in entries if e["kind"] == "reservation_accepted")
        charged = granted_steps(entries, reservation_of(job))
        assert budget["rdp_spent"] == pytest.approx(
            independent_rdp(ev["noise_multiplier"], ev["sample_rate"], charged,
                            budget["admission_order"]), rel=1e-9)
        spent_before = budget["rdp_spent"]

        # The api: the worker's proposal made the job interrupted; the reaper requeued it.
        deadline = time.monotonic() + 30
        while (job := client.get_job(job_id))["state"] != "queued":
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["attempt"] == attempt + 1
        # Before exiting, the worker had its proposal accepted (the reaper only requeues).
        assert any(r["logger"] == "httpx" and "/transition " in r["msg"]
                   and r["msg"].endswith('"HTTP/1.1 200 OK"') for r in records)
        assert seen <= {("running", attempt), ("interrupted", attempt),
                        ("queued", attempt + 1)}, seen
        # Where the drain time went (log timestamps, ms): for sizing grace periods.
        at = {m: datetime.fromisoformat(next(r["ts"] for r in records if r["msg"] == m))
              .timestamp() - sent_at for m in (
                  "worker shutting down; stopping the running job at a step boundary",
                  "training stopped at a step boundary", "attempt finished")}
        handled, stopped, done = at.values()
        print(f"drain {attempt}: {seconds:.2f}s to exit; signal handled +{handled:.2f}s, "
              f"step finished and checkpoint uploaded +{stopped:.2f}s, lease ended and "
              f"job reported +{done:.2f}s, process exit +{seconds:.2f}s (stopped at step "
              f"{step}, leased to {leased_to}, checkpoint {stat.size} bytes)")

        platform.start_worker(attempt)
        resumed_from = step

    job = client.wait_for_job(job_id, timeout=600, poll=0.5)
    assert job["state"] == "succeeded", job
    assert job["attempt"] == DRAINS + 1
    rid = reservation_of(job)
    assert job["result"]["steps_used"][rid] == total

    # Each later attempt's first lease starts at the checkpoint its predecessor stopped at.
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, dataset_id)
    leases = [e["payload"] for e in entries if e["kind"] == "lease_granted"]
    firsts = {}
    for lease in leases:
        firsts.setdefault(lease["attempt"], lease["start_step"])
    stops = [next(r["step"] for r in _log(platform, f"worker-{a - 1}")
                  if r.get("job_id") == job_id
                  and r["msg"] == "training stopped at a step boundary")
             for a in range(1, DRAINS + 1)]
    assert firsts == {1: 0, **{a + 1: s for a, s in enumerate(stops, 1)}}
    resumed = [r for r in _log(platform, f"worker-{DRAINS}") if r.get("job_id") == job_id
               and r["msg"] == "steps leased"]
    assert resumed[0]["start_step"] == stops[-1]

    # Charged: exactly the granted steps, i.e. the planned ones plus each drained lease's
    # unrun tail; nothing was charged twice.
    charged = granted_steps(entries, rid)
    unrun = 0
    for a, stop_at in enumerate(stops, 1):
        leased_to = max(p["start_step"] + p["steps"] for p in leases if p["attempt"] == a)
        unrun += leased_to - stop_at
    assert charged == total + unrun
    budget = client.get_budget(dataset_id)
    ev = next(e["payload"]["event"] for e in entries if e["kind"] == "reservation_accepted")
    assert budget["rdp_spent"] == pytest.approx(
        independent_rdp(ev["noise_multiplier"], ev["sample_rate"], charged,
                        budget["admission_order"]), rel=1e-9)
    assert budget["rdp_spent"] >= spent_before
    assert budget["rdp_reserved"] == pytest.approx(0.0, abs=1e-15)
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]

    # The api's access lines carry request ids, the job's GETs among them.
    api = _log(platform, "api")
    gets = [r for r in api if r["msg"] == "request" and r.get("route") == "/v1/jobs/{job_id}"]
    assert gets and all(r.get("request_id") for r in gets)
    print("drain times (s):", ", ".join(f"{d:.2f}" for d in drains))
