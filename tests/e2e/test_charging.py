"""Charging under cancellation and crashes, against the whole platform.

- cancel a finetune at a random step: the accumulator's increment equals the RDP at the
  admission order of the granted steps (independent computation, to 1e-9) and the rest is
  released;
- SIGKILL the worker mid-training: the reaper marks the job interrupted, spent covers every
  granted step, the next attempt needs a new admission for replayed steps; with a budget too
  small for them the job ends failed and spent stays ≤ limit; the hash chain verifies.
"""

from __future__ import annotations

import random
import time

import pytest
from dpsynth_client import Client

from tests.e2e.conftest import CLASSES, digits_npz, finetune_spec
from tests.e2e.ledger_replay import (
    independent_dp_sgd_epsilon,
    independent_rdp,
    ledger_entries,
    verify_chain,
)
from tests.support.models import tiny_model_archive

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def base_model(client: Client, tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("base")
    archive = tiny_model_archive(tmp / "model.tar", class_names=CLASSES)
    return client.upload_model(archive, name="tiny-base")["model_id"]


def private_dataset(client: Client, tmp_path, *, limit: float, n: int = 200) -> dict:
    npz, _ = digits_npz(tmp_path / f"priv-{limit}.npz", part="private", n=n)
    return client.upload_dataset(npz, name="priv", visibility="private", epsilon_limit=limit,
                                 label_domain=CLASSES, declared_size=n)


def wait_for_step(client: Client, job_id: str, step: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if (job.get("progress") or {}).get("step", 0) >= step or job["state"] in TERMINAL:
            return job
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} did not reach step {step}")


def granted_steps(entries: list[dict], reservation_id: str) -> int:
    return sum(e["payload"]["event"]["steps"] for e in entries
               if e["kind"] == "lease_granted" and e["payload"]["reservation_id"] == reservation_id)


def reservation_of(job: dict) -> str:
    return job["privacy"]["reservation_id"]


def test_cancel_at_a_random_step_charges_exactly_the_granted_steps(platform, client,
                                                                   base_model, tmp_path):
    ds = private_dataset(client, tmp_path, limit=10.0)
    job = client.submit_job(finetune_spec(ds["dataset_id"], base_model, expected_batch_size=8,
                                          epochs=2, checkpoint_every=2))
    wait_for_step(client, job["job_id"], random.Random().randint(3, 12))
    client.cancel_job(job["job_id"])
    job = client.wait_for_job(job["job_id"], timeout=300)
    assert job["state"] == "cancelled", job
    budget = client.get_budget(ds["dataset_id"])
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, ds["dataset_id"])
    steps = granted_steps(entries, reservation_of(job))
    assert steps > 0
    ev = next(e["payload"]["event"] for e in entries if e["kind"] == "reservation_accepted")
    expected = independent_rdp(ev["noise_multiplier"], ev["sample_rate"], steps,
                               budget["admission_order"])
    assert budget["rdp_spent"] == pytest.approx(expected, rel=1e-9)
    assert budget["rdp_reserved"] == pytest.approx(0.0, abs=1e-15)
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]


def test_sigkill_mid_training_is_charged_and_resumed_with_a_new_admission(platform, client,
                                                                          base_model,
                                                                          tmp_path):
    ds = private_dataset(client, tmp_path, limit=10.0)
    job = client.submit_job(finetune_spec(ds["dataset_id"], base_model, expected_batch_size=8,
                                          epochs=2, checkpoint_every=2))
    wait_for_step(client, job["job_id"], 5)
    platform.kill("worker-0")
    platform.start_worker(1)
    job = client.wait_for_job(job["job_id"], timeout=600)
    assert job["state"] == "succeeded", job
    assert job["attempt"] >= 2
    budget = client.get_budget(ds["dataset_id"])
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, ds["dataset_id"])
    steps = granted_steps(entries, reservation_of(job))
    reserved_steps = job["privacy"]["steps"]
    assert steps >= reserved_steps
    kinds = [e["kind"] for e in entries]
    if steps > reserved_steps:  # replayed steps beyond the reservation were admitted anew
        assert "extension_accepted" in kinds
    ev = next(e["payload"]["event"] for e in entries if e["kind"] == "reservation_accepted")
    expected = independent_rdp(ev["noise_multiplier"], ev["sample_rate"], steps,
                               budget["admission_order"])
    assert budget["rdp_spent"] == pytest.approx(expected, rel=1e-9)
    assert budget["dataset_epsilon_spent"] <= budget["epsilon_limit"]
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]
    # Every attempt after the first had its own read grant (fresh leases).
    attempts = {e["payload"].get("attempt") for e in entries if e["kind"] == "read_grant"}
    assert {1, 2} <= attempts
    # The model states the epsilon of the steps that produced it (the planned length: the
    # lost attempt's steps after its last checkpoint are charged above, not on its path),
    # by a second accountant.
    model = client.get_model(job["result"]["model_id"])
    sigma, q = ev["noise_multiplier"], ev["sample_rate"]
    assert model["job_epsilon"] == pytest.approx(
        independent_dp_sgd_epsilon(sigma, q, reserved_steps, budget["delta"]), rel=0.03)
    if steps > reserved_steps:
        assert model["job_epsilon"] < independent_dp_sgd_epsilon(sigma, q, steps,
                                                                 budget["delta"])


def test_sigkill_with_no_budget_left_for_replays_fails_and_never_overspends(platform, client,
                                                                            base_model,
                                                                            tmp_path):
    ds = private_dataset(client, tmp_path, limit=3.0)
    spec = finetune_spec(ds["dataset_id"], base_model, expected_batch_size=8, epochs=2,
                         checkpoint_every=4)
    plan = client.submit_job({**spec, "privacy": {"target_epsilon": 2.9,
                                                  "max_grad_norm": 1.0}}, dry_run=True)
    best = plan["plan"]["max_admissible_target_epsilon"]
    spec["privacy"]["target_epsilon"] = best * 0.999  # leaves no room for replayed steps
    job = client.submit_job(spec)
    wait_for_step(client, job["job_id"], 6)
    worker = next(n for n in platform.procs if n.startswith("worker")
                  and platform.procs[n].poll() is None)
    platform.kill(worker)
    platform.start_worker(len(platform.procs))
    job = client.wait_for_job(job["job_id"], timeout=600)
    budget = client.get_budget(ds["dataset_id"])
    assert budget["dataset_epsilon_spent"] <= budget["epsilon_limit"] + 1e-12
    entries = ledger_entries(platform.ledger_url, platform.api_ledger_token, ds["dataset_id"])
    if any(e["kind"] == "extension_refused" for e in entries):
        assert job["state"] == "failed", job
        assert job["error"]["code"] == "privacy_budget_exhausted"
    else:  # killed exactly at a lease boundary: nothing to replay
        assert job["state"] == "succeeded", job
    assert verify_chain(platform.ledger_url, platform.api_ledger_token)["ok"]
