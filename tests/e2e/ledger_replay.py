"""An independent replay of the ledger's chain: opacus' RDP analysis (a second library,
not dp_accounting which the ledger uses) at the dataset's admission order."""

from __future__ import annotations

import math

import httpx
from opacus.accountants.analysis.rdp import compute_rdp

HOLDOUT = "*holdout"
"""The held-out partition (disjoint from "*" and every label)."""


def independent_rdp(noise_multiplier: float, sample_rate: float, steps: int,
                    order: int) -> float:
    return float(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                             orders=[float(order)])[0])


def conversion(rdp: float, order: int, delta: float) -> float:
    """The RDP→(ε,δ) conversion named by the ledger (Canonne–Kamath–Steinke 2020 /
    Balle et al. 2020, as dp_accounting's RdpAccountant)."""
    a = order
    return max(0.0, rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1))


def replay_accumulators(entries: list[dict]) -> dict[str, float]:
    """Committed RDP per partition, rebuilt from a dataset's entries with opacus alone.

    The partitions and the order come from the ``budget_created`` entry. Every
    ``lease_granted`` entry records the DP event its steps ran (σ, q, steps): a
    whole-dataset lease adds its RDP to every partition (``"*"`` and each label); a lease of
    a per-label job (``per_label`` with its class in ``label``) adds only to its class's
    partition (parallel composition over the declared labels). The dataset's figure is then
    the conversion of the max over partitions. A ``histogram_released`` entry (the class
    sizes released by a Gaussian histogram, sensitivity Δ) adds the RDP of one Gaussian of
    noise multiplier σ/Δ (q = 1, one step: α/(2(σ/Δ)²)) to every partition: each class's
    count is a Gaussian release on its partition, and "*" sees the whole histogram.

    The ``budget_created`` entry also fixes two routings (issue 4): on a ``replace_one``
    dataset a DP-SGD lease (analysed add/remove) is charged through group privacy at distance
    2, 3 × its RDP at twice the order (Mironov 2017, Prop. 2); when ``partitions_disjoint`` is
    false a per-label lease adds to EVERY partition (the classes are summed).

    A ``dp_evaluation_released`` entry (issue 13, item 6: m correct-classification counts on
    the HELD-OUT records, sensitivity √m) adds one Gaussian's RDP to the held-out partition
    ``"*holdout"`` ALONE (created by the first one); training charges never enter it.

    A ``central_images_released`` entry (issue 18, item 3: a finetune's DP class means, one
    mechanism over all classes) adds to every TRAINING partition once: a ``gaussian`` event
    (recorded under the dataset's relation, sensitivity Δ) one Gaussian's RDP; a ``dp_sgd``
    event (subsampled queries, add/remove) the RDP of its steps, through group privacy on a
    replace-one dataset like a lease.
    """
    entries = sorted(entries, key=lambda e: e["seq"])
    created = next(e["payload"] for e in entries if e["kind"] == "budget_created")
    order = int(created["admission_order"])
    committed = {p: 0.0 for p in created["partitions"]}
    group = created.get("neighbouring") == "replace_one"
    disjoint = created.get("partitions_disjoint", True) is not False
    for e in entries:
        if e["kind"] == "histogram_released":  # one Gaussian: every TRAINING partition, once
            ev = e["payload"]["event"]
            rdp = independent_rdp(ev["sigma"] / ev["sensitivity"], 1.0, 1, order)
            for p in committed:
                if p != HOLDOUT:
                    committed[p] += rdp
            continue
        if e["kind"] == "dp_evaluation_released":  # one Gaussian: the held-out part ALONE
            ev = e["payload"]["event"]
            rdp = independent_rdp(ev["sigma"] / ev["sensitivity"], 1.0, 1, order)
            committed[HOLDOUT] = committed.get(HOLDOUT, 0.0) + rdp
            continue
        if e["kind"] == "central_images_released":  # every TRAINING partition, once
            ev = e["payload"]["event"]
            if ev["kind"] == "gaussian":
                rdp = independent_rdp(ev["sigma"] / ev["sensitivity"], 1.0, 1, order)
            elif group:
                rdp = 3 * independent_rdp(ev["noise_multiplier"], ev["sample_rate"],
                                          ev["steps"], 2 * order)
            else:
                rdp = independent_rdp(ev["noise_multiplier"], ev["sample_rate"], ev["steps"],
                                      order)
            for p in committed:
                if p != HOLDOUT:
                    committed[p] += rdp
            continue
        if e["kind"] != "lease_granted":
            continue
        payload, ev = e["payload"], e["payload"]["event"]
        rdp = (3 * independent_rdp(ev["noise_multiplier"], ev["sample_rate"], ev["steps"],
                                   2 * order) if group else
               independent_rdp(ev["noise_multiplier"], ev["sample_rate"], ev["steps"], order))
        targets = ([payload["label"]] if payload.get("per_label") and disjoint
                   else [p for p in committed if p != HOLDOUT])
        for p in targets:
            committed[p] += rdp
    return committed


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


def independent_dp_sgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int,
                               delta: float) -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian steps by opacus' PRV accountant
    (Gopi et al. 2021): a second accountant, independent of the ledger's PLD code."""
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(noise_multiplier, sample_rate, steps)]
    return float(acc.get_epsilon(delta=delta))
