"""50 concurrent reservations over HTTP against one budget (real uvicorn + httpx threads).

The chain's entries, replayed in order through an INDEPENDENT RDP computation (opacus'
``compute_rdp`` at the admission order + the conversion's inverse written out here), reproduce
every accept and refuse; the final filter figure stays within the limit; closing everything
releases every untouched reservation.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from dpsynth_ledger.app import create_app
from dpsynth_ledger.settings import LedgerSettings
from opacus.accountants.analysis.rdp import compute_rdp

from tests.support.servers import free_port, wait_for_port

from .conftest import AUTH

LIMIT, DELTA, N = 8.0, 1e-6, 60_000


@pytest.fixture()
def base_url(settings: LedgerSettings) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _budget_rdp(limit: float, order: int, delta: float) -> float:
    """Inverse of eps = rdp + log(1 - 1/a) - (log delta + log a)/(a - 1), written out."""
    return limit - math.log((order - 1) / order) + (math.log(delta) + math.log(order)) / (order - 1)


def test_fifty_concurrent_reservations_replay_exactly(base_url: str) -> None:
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=120) as c:
        r = c.post("/v1/budgets", json={"dataset_id": "ds_cc", "tenant_id": "ten_x",
                                        "epsilon_limit": LIMIT, "delta": DELTA,
                                        "declared_size": N})
        assert r.status_code == 201
        order = r.json()["admission_order"]
    shapes = list(itertools.product([1.5, 3.0], [300, 600, 1200], [200, 400]))

    def submit(i: int) -> tuple[int, dict]:
        target, batch, steps = shapes[i % len(shapes)]
        with httpx.Client(base_url=base_url, headers=AUTH, timeout=300) as client:
            resp = client.post("/v1/reservations", json={
                "job_id": f"job_{i:03d}", "dataset_id": "ds_cc", "target_epsilon": target,
                "expected_batch_size": batch, "steps": steps})
            return resp.status_code, resp.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(submit, range(50)))
    statuses = [s for s, _ in results]
    assert set(statuses) <= {201, 409}
    accepted = [b for s, b in results if s == 201]
    assert 0 < len(accepted) < 50
    assert all(b["code"] == "privacy_budget_exhausted" for s, b in results if s == 409)

    with httpx.Client(base_url=base_url, headers=AUTH, timeout=120) as c:
        entries = c.get("/v1/entries", params={"dataset_id": "ds_cc"}).json()
        decisions = [e for e in entries if e["kind"] in ("reservation_accepted",
                                                         "reservation_refused")]
        assert len(decisions) == 50
        budget = _budget_rdp(LIMIT, order, DELTA)
        held = 0.0
        for e in decisions:  # independent replay, in chain order
            ev = e["payload"]["event"]
            new = float(compute_rdp(q=ev["sample_rate"], noise_multiplier=ev["noise_multiplier"],
                                    steps=ev["steps"], orders=[order])[0])
            fits = held + new <= budget
            if abs(held + new - budget) > 1e-9 * budget:  # never this close in practice
                assert fits == (e["kind"] == "reservation_accepted"), e["seq"]
            if e["kind"] == "reservation_accepted":
                held += new
        assert held <= budget * (1 + 1e-12)
        view = c.get("/v1/budgets/ds_cc", params={"history": False}).json()
        assert view["rdp_reserved"] == pytest.approx(held, rel=1e-9)
        assert view["dataset_epsilon_spent"] + view["dataset_epsilon_reserved"] <= LIMIT
        for b in accepted:
            closed = c.post(f"/v1/reservations/{b['reservation_id']}/close",
                            json={"outcome": "cancelled"})
            assert closed.status_code == 200
        view = c.get("/v1/budgets/ds_cc", params={"history": False}).json()
        assert view["rdp_reserved"] == 0.0 and view["rdp_spent"] == 0.0
        assert view["dataset_epsilon_spent"] == 0.0
        assert view["partitions"] == {"*": 0.0}
        assert c.get("/v1/chain/verify").json()["ok"] is True
        metrics = c.get("/metrics").text
        assert ('dpsynth_ledger_admissions_total{decision="accepted",kind="reservation",'
                f'reason="none"}} {len(accepted)}.0') in metrics
