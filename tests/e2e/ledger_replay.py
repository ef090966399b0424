"""An independent replay of the ledger's chain: opacus' RDP analysis (a second library,
not dp_accounting which the ledger uses) at the dataset's admission order."""

from __future__ import annotations

import math

import httpx
from opacus.accountants.analysis.rdp import compute_rdp


def independent_rdp(noise_multiplier: float, sample_rate: float, steps: int,
                    order: int) -> float:
    return float(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                             orders=[float(order)])[0])


def conversion(rdp: float, order: int, delta: float) -> float:
    """The RDP→(ε,δ) conversion named by the ledger (Canonne–Kamath–Steinke 2020 /
    Balle et al. 2020, as dp_accounting's RdpAccountant)."""
    a = order
    return max(0.0, rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1))


def ledger_entries(ledger_url: str, token: str, dataset_id: str) -> list[dict]:
    r = httpx.get(f"{ledger_url}/v1/entries", params={"dataset_id": dataset_id, "limit": 10000},
                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    body = r.json()
    entries = body["items"] if isinstance(body, dict) else body
    return sorted(entries, key=lambda e: e["seq"])


def verify_chain(ledger_url: str, token: str) -> dict:
    r = httpx.get(f"{ledger_url}/v1/chain/verify",
                  headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r.raise_for_status()
    return r.json()
