"""The global hash chain of ledger entries: append, and verify by replay.

Each entry's hash is ``chain_hash(prev_hash, {seq, dataset_id, kind, payload})`` (sha256 over
canonical JSON, :func:`dpsynth_shared.dp_events.chain_hash`), starting from ``GENESIS_HASH``.
Verification recomputes every hash and link, recomputes every RDP charge from the recorded DP
event, and replays the accumulators from the entries alone to compare them with the stored ones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.dp_events import GENESIS_HASH, GaussianEvent, chain_hash
from dpsynth_shared.ledger_contract import VerifyReport
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    WHOLE_DATASET,
    add_up,
    mul_up,
    rdp_at_order,
    rdp_step,
    sum_up,
)
from dpsynth_ledger.book import touched
from dpsynth_ledger.models import Entry

PAYLOAD_VERSION = 1


def entry_hash(prev_hash: str, *, seq: int, dataset_id: str, kind: str,
               payload: dict[str, Any]) -> str:
    """The hash of one entry from its canonical content and its predecessor's hash."""
    return chain_hash(prev_hash, {"seq": seq, "dataset_id": dataset_id, "kind": kind,
                                  "payload": payload})


def append_entry(session: Session, *, dataset_id: str, kind: str,
                 payload: dict[str, Any]) -> Entry:
    """Append an entry (the caller already holds the dataset's budget-row lock)."""
    head = repo.lock_chain_head(session)
    at = datetime.now(UTC)
    body = {"v": PAYLOAD_VERSION, "at": at.isoformat(), "dataset_id": dataset_id,
            "kind": kind, **payload}
    seq = head.seq + 1
    digest = entry_hash(head.hash, seq=seq, dataset_id=dataset_id, kind=kind, payload=body)
    return repo.insert_entry(session, head, seq=seq, at=at, dataset_id=dataset_id, kind=kind,
                             payload=body, prev_hash=head.hash, digest=digest)


class _Replay:
    """Accumulators of one dataset rebuilt from its entries alone.

    Holds are kept per (reservation, run): a whole-dataset reservation has one run on
    ``"*"`` (it holds on every partition); a per-label one has one run per class, each
    holding only on its class (``label_rdp_outstanding`` in its entries).
    """

    def __init__(self, payload: dict[str, Any]) -> None:
        self.order = int(payload["admission_order"])
        self.committed = {p: 0.0 for p in payload["partitions"]}
        self.holds: dict[tuple[str, str], float] = {}
        self.releases: set[str] = set()
        self.sized = payload.get("class_sizes") is not None

    def reserved(self) -> dict[str, float]:
        out: dict[str, list[float]] = {p: [] for p in self.committed}
        for (_, partition), amount in self.holds.items():
            for p in touched(partition, self.committed):
                out[p].append(amount)
        return {p: sum_up(v) for p, v in out.items()}

    def _hold(self, rid: str, payload: dict[str, Any]) -> None:
        if payload.get("per_label"):
            for label, amount in payload["label_rdp_outstanding"].items():
                self.holds[(rid, label)] = float(amount)
        else:
            self.holds[(rid, payload["partition"])] = float(
                payload["reservation_rdp_outstanding"])

    def apply(self, kind: str, payload: dict[str, Any], problems: list[str], seq: int) -> None:
        rid = str(payload.get("reservation_id"))
        if kind in ("reservation_accepted", "extension_accepted"):
            self._hold(rid, payload)
        elif kind == "lease_granted":
            ev = payload["event"]
            amount = mul_up(int(ev["steps"]), rdp_step(float(ev["noise_multiplier"]),
                                                       float(ev["sample_rate"]), self.order))
            run = payload.get("label") if payload.get("per_label") else WHOLE_DATASET
            expected = set(touched(run, self.committed)) if run is not None else set()
            if set(payload["rdp_delta"]) != expected:
                problems.append(f"entry {seq}: charged partitions {sorted(payload['rdp_delta'])}"
                                f" != those its run touches {sorted(expected)}")
            for p, recorded in payload["rdp_delta"].items():
                if recorded != amount:
                    problems.append(f"entry {seq}: charge {recorded} != recomputed {amount}")
                self.committed[p] = add_up(self.committed.get(p, 0.0), float(recorded))
            self._hold(rid, payload)
        elif kind == "histogram_released":  # one Gaussian: every partition, full RDP once
            amount = rdp_at_order(GaussianEvent.model_validate(payload["event"]), self.order)
            if set(payload["rdp_delta"]) != set(self.committed):
                problems.append(f"entry {seq}: a histogram release must charge every partition"
                                f", not {sorted(payload['rdp_delta'])}")
            for p, recorded in payload["rdp_delta"].items():
                if recorded != amount:
                    problems.append(f"entry {seq}: charge {recorded} != recomputed {amount}")
                self.committed[p] = add_up(self.committed.get(p, 0.0), float(recorded))
            self.releases.add(payload["release_id"])
        elif kind == "class_sizes_set":
            if self.sized:
                problems.append(f"entry {seq}: class sizes set twice")
            if payload.get("release_id") not in self.releases:
                problems.append(f"entry {seq}: class sizes name no earlier histogram release")
            self.sized = True
        elif kind == "reservation_closed":
            for key in [k for k in self.holds if k[0] == rid]:
                del self.holds[key]

    def check(self, accs: dict[str, dict[str, float]], where: str, problems: list[str]) -> None:
        reserved = self.reserved()
        for p, values in accs.items():
            same = (values["committed"] == self.committed.get(p)
                    and values["reserved"] == reserved.get(p))
            if not same:
                problems.append(
                    f"{where}: partition {p!r} stores committed={values['committed']} "
                    f"reserved={values['reserved']}, replay gives committed="
                    f"{self.committed.get(p)} reserved={reserved.get(p)}")


def _missing(first: int, last: int, why: str) -> str:
    """The problem line naming the missing entries ``first..last``."""
    which = f"entry {first}" if first == last else f"entries {first}..{last}"
    return f"{which}: missing ({why})"


def verify_chain(session: Session) -> VerifyReport:
    """Recompute every hash and link, every charge, and every accumulator from the entries."""
    problems: list[str] = []
    prev, count, last_seq = GENESIS_HASH, 0, 0
    replays: dict[str, _Replay] = {}
    for entry in repo.entries(session):
        count += 1
        if entry.seq > last_seq + 1:  # sequence numbers are dense: a gap is a deleted entry
            problems.append(_missing(last_seq + 1, entry.seq - 1, "deleted from the chain"))
        last_seq = entry.seq
        if entry.prev_hash != prev:
            problems.append(f"entry {entry.seq}: prev_hash does not link to entry before it")
        digest = entry_hash(entry.prev_hash, seq=entry.seq, dataset_id=entry.dataset_id,
                            kind=entry.kind, payload=entry.payload)
        if digest != entry.hash:
            problems.append(f"entry {entry.seq}: hash mismatch (content altered)")
        prev = entry.hash
        payload = entry.payload
        if entry.kind == "budget_created":
            replays[entry.dataset_id] = _Replay(payload)
            continue
        replay = replays.get(entry.dataset_id)
        if replay is None:
            problems.append(f"entry {entry.seq}: dataset has no budget_created entry")
            continue
        replay.apply(entry.kind, payload, problems, entry.seq)
        after = payload.get("accumulators_after")
        if isinstance(after, dict):
            replay.check(after, f"entry {entry.seq}", problems)
    head = repo.chain_head(session)
    if head.seq > last_seq:
        problems.append(_missing(last_seq + 1, head.seq, f"the chain head is at entry {head.seq}"))
    if head.hash != prev:
        problems.append("chain head does not point at the last entry")
    for budget in repo.all_budgets(session):
        stored = {p: {"committed": a.committed, "reserved": a.reserved}
                  for p, a in repo.accumulators(session, budget.dataset_id).items()}
        replay = replays.get(budget.dataset_id)
        if replay is None:
            problems.append(f"dataset {budget.dataset_id}: no entries")
            continue
        replay.check(stored, f"dataset {budget.dataset_id} (stored)", problems)
    return VerifyReport(ok=not problems, entries=count, head=prev, problems=problems,
                        details={"datasets": len(replays)})
