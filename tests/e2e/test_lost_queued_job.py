"""No queued job is lost across a restart (issue 14, item 2), on the whole platform.

A worker is SIGKILLed mid-finetune with a second finetune queued behind it, the api is
killed too, and the two come back in either order:

- worker first, while the api is down: the new worker takes the queued job's message at
  once; its claim waits for the api and the message is kept (not acknowledged and dropped);
- api first, after the broker lost its messages: the reaper re-sends the queued job's task
  (``queued_resend_s``), and requeues the interrupted one.

Both jobs complete and each reservation is closed exactly once at the ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from dpsynth_client import Client

from tests.e2e.conftest import finetune_spec, make_platform
from tests.e2e.ledger_replay import ledger_entries, verify_chain
from tests.e2e.test_charging import (  # noqa: F401  (base_model is a fixture)
    base_model,
    private_dataset,
    reservation_of,
    wait_for_step,
)
from tests.support.platform import ServicePlatform

#: The api's re-send period when the test wants the reaper to re-send (short) or not.
RESEND_SHORT_S, RESEND_OFF_S = 3, 3600


@pytest.fixture(scope="module")
def platform(tmp_path_factory, pg, redis_url, s3_endpoint) -> Iterator[ServicePlatform]:
    p = make_platform(tmp_path_factory.mktemp("platform"), pg, redis_url, s3_endpoint,
                      workers=1, extra_env={"DPSYNTH_API_QUEUED_RESEND_S": str(RESEND_OFF_S)})
    yield p
    p.stop()


def _records(platform: ServicePlatform, name: str) -> list[dict[str, Any]]:
    out = []
    path = platform.workdir / f"{name}.log"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _two_jobs_one_running(platform: ServicePlatform, client: Client, base_model: str,  # noqa: F811
                          tmp_path) -> tuple[str, str, str]:
    """A finetune mid-training and a second one queued behind it (one worker; the api and a
    worker are started first where an earlier test left them down)."""
    if platform.procs["api"].poll() is not None:
        _start_api(platform)
    if all(p.poll() is not None for n, p in platform.procs.items() if n.startswith("worker-")):
        _new_worker(platform)
    ds = private_dataset(client, tmp_path, limit=10.0)
    spec = finetune_spec(ds["dataset_id"], base_model, target_epsilon=1.0,
                         expected_batch_size=8, epochs=0.25, checkpoint_every=2)
    running = client.submit_job(spec)["job_id"]
    queued = client.submit_job(spec)["job_id"]
    wait_for_step(client, running, 2)
    assert client.get_job(queued)["state"] == "queued"
    return ds["dataset_id"], running, queued


def _kill_workers_and_api(platform: ServicePlatform) -> None:
    for name in [n for n in platform.procs if n.startswith("worker-")]:
        platform.kill(name)
    platform.kill("api")


def _new_worker(platform: ServicePlatform) -> str:
    """Start one more worker process; returns its name (its log is ``<name>.log``)."""
    index = sum(n.startswith("worker-") for n in platform.procs)
    platform.start_worker(index)
    return f"worker-{index}"


def _start_api(platform: ServicePlatform) -> None:
    platform._spawn("api", "dpsynth_api")
    platform._wait_ready(platform.api_url, "api")


def _completes_once(platform: ServicePlatform, client: Client, dataset_id: str,
                    job_ids: list[str]) -> list[dict]:
    """Every job succeeds; its reservation is closed exactly once and nothing stays
    reserved; the ledger's chain verifies."""
    jobs = [client.wait_for_job(j, timeout=300, poll=0.5) for j in job_ids]
    for job in jobs:
        assert job["state"] == "succeeded", job
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, dataset_id)
    closes = [e["payload"] for e in entries if e["kind"] == "reservation_closed"]
    for job in jobs:
        mine = [c for c in closes if c.get("reservation_id") == reservation_of(job)]
        assert len(mine) == 1, (job["job_id"], mine)
    assert client.get_budget(dataset_id)["rdp_reserved"] == pytest.approx(0.0, abs=1e-15)
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]
    return jobs


def test_worker_restarted_before_the_api_keeps_the_queued_message(
        platform: ServicePlatform, client: Client, base_model: str, tmp_path) -> None:  # noqa: F811
    dataset_id, running, queued = _two_jobs_one_running(platform, client, base_model, tmp_path)
    _kill_workers_and_api(platform)
    platform.extra_env["DPSYNTH_API_QUEUED_RESEND_S"] = str(RESEND_OFF_S)
    worker = _new_worker(platform)
    # The new worker takes the queued job's message while the api is down, and waits.
    deadline = time.monotonic() + 120
    while not any(r["msg"] == "the api cannot take the claim yet; waiting"
                  and r.get("job_id") == queued and r.get("retry_in_s", 0) >= 2
                  for r in _records(platform, worker)):
        assert time.monotonic() < deadline, platform.log(worker)
        time.sleep(0.3)
    _start_api(platform)

    running_job, queued_job = _completes_once(platform, client, dataset_id, [running, queued])
    assert queued_job["attempt"] == 1  # the kept message ran it, no re-send was needed
    assert running_job["attempt"] == 2  # the reaper requeued the lost attempt
    assert not any(r["msg"].startswith("re-sent the task") and r.get("job_id") == queued
                   for r in _records(platform, "api"))


def test_api_restarted_first_resends_a_queued_job_whose_message_was_lost(
        platform: ServicePlatform, client: Client, base_model: str, tmp_path) -> None:  # noqa: F811
    dataset_id, running, queued = _two_jobs_one_running(platform, client, base_model, tmp_path)
    _kill_workers_and_api(platform)
    redis.Redis.from_url(platform.broker_url).flushdb()  # a broker that lost its data
    platform.extra_env["DPSYNTH_API_QUEUED_RESEND_S"] = str(RESEND_SHORT_S)
    _start_api(platform)
    worker = _new_worker(platform)

    running_job, queued_job = _completes_once(platform, client, dataset_id, [running, queued])
    assert queued_job["attempt"] == 1
    assert running_job["attempt"] == 2
    resent = [r for r in _records(platform, "api")
              if r["msg"].startswith("re-sent the task") and r.get("job_id") == queued]
    assert resent and all(r["attempt"] == 1 for r in resent)
    # While it waited behind the other job it may have been re-sent more than once: the
    # duplicates were refused at claim, and it ran once.
    lines = [r["msg"] for r in _records(platform, worker) if r.get("job_id") == queued]
    assert lines.count("job claimed") == 1
