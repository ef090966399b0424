"""The global hash chain of ledger entries: append, and verify by replay.

Each entry's hash is ``chain_hash(prev_hash, {seq, dataset_id, kind, payload})`` (sha256 over
canonical JSON, :func:`dpsynth_shared.dp_events.chain_hash`), starting from ``GENESIS_HASH``.
Verification recomputes every hash and link, recomputes every RDP charge from the recorded DP
event, and replays the accumulators from the entries alone to compare them with the stored ones.

Every entry is signed with the chain key (``signature`` over ``signed_message(seq, hash)``)
and anchored outside the database (:mod:`dpsynth_ledger.anchor`): :func:`append_entry` queues
the anchor record in the session and a ``before_commit`` hook writes the transaction's records
to the anchor, under the chain-head lock, before the database commits. A write is refused
(503 ``ledger_behind_anchor``) while the database's head is not the anchored head.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.central_images import central_image_bound, central_image_sensitivity
from dpsynth_shared.dp_events import GENESIS_HASH, DpSgdEvent, GaussianEvent, chain_hash
from dpsynth_shared.grants import verify_message
from dpsynth_shared.ledger_contract import AnchorStatus, VerifyReport
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import (
    HOLDOUT,
    WHOLE_DATASET,
    add_up,
    charge_step,
    mul_up,
    rdp_at_order,
    sum_up,
)
from dpsynth_ledger.anchor import AnchoredHead, ChainKeeper, rebase_message
from dpsynth_ledger.book import touched
from dpsynth_ledger.models import Entry

PAYLOAD_VERSION = 1

CHAIN_KEY = "dpsynth_chain"
"""``Session.info`` key of the :class:`ChainKeeper` (set by the app's session factory)."""
_PENDING = "dpsynth_anchor_pending"
_LINEAGE = "dpsynth_anchor_lineage"
REBASE_KEY = "dpsynth_anchor_rebase"
"""``Session.info`` key reconciliation sets: the rebase record that re-bases the anchor on
the database's head; the transaction's first entry is then allowed although the database is
behind, and the rebase record is anchored before it."""
RESTORED_CHARGE = "restored_charge"
RECONCILED = "reconciled"
CENTRAL_IMAGES_RELEASED = "central_images_released"
"""A finetune's DP central-image release (service/central_images.py): one Gaussian over all
class sums (``gaussian``) or ``queries`` subsampled ones (``dp_sgd``), charged once to every
training partition."""
CENTRAL_IMAGES_REFUSED = "central_images_refused"


def central_event(event: Any) -> DpSgdEvent | GaussianEvent:
    """The recorded event of a central-image release: a one-shot Gaussian, or a DP-SGD event
    for Poisson-subsampled queries (pydantic's ValidationError, a ValueError, otherwise)."""
    if isinstance(event, dict) and (event.get("kind") == "dp_sgd" or "noise_multiplier" in event):
        return DpSgdEvent.model_validate(event)
    return GaussianEvent.model_validate(event)


def entry_hash(prev_hash: str, *, seq: int, dataset_id: str, kind: str,
               payload: dict[str, Any]) -> str:
    """The hash of one entry from its canonical content and its predecessor's hash."""
    return chain_hash(prev_hash, {"seq": seq, "dataset_id": dataset_id, "kind": kind,
                                  "payload": payload})


def append_entry(session: Session, *, dataset_id: str, kind: str,
                 payload: dict[str, Any]) -> Entry:
    """Append a signed entry and queue its anchor record (the caller already holds the
    dataset's budget-row lock; the record is anchored by the ``before_commit`` hook).

    Raises:
        DpsynthError: 503 ``ledger_behind_anchor`` when the database's head is not the
            anchored head (checked under the chain-head lock at the transaction's first entry).
    """
    head = repo.lock_chain_head(session)
    keeper: ChainKeeper | None = session.info.get(CHAIN_KEY)
    pending: list[dict[str, Any]] = session.info.setdefault(_PENDING, [])
    if keeper is not None and not pending:
        rebase = session.info.pop(REBASE_KEY, None)
        if rebase is not None:  # reconciliation: re-base the anchor on this head first
            pending.append(rebase)
            session.info[_LINEAGE] = int(rebase["lineage"])
        else:
            session.info[_LINEAGE] = keeper.refuse_unless_current(head.seq, head.hash).lineage
    at = datetime.now(UTC)
    body = {"v": PAYLOAD_VERSION, "at": at.isoformat(), "dataset_id": dataset_id,
            "kind": kind, **payload}
    seq = head.seq + 1
    prev_hash = head.hash
    digest = entry_hash(prev_hash, seq=seq, dataset_id=dataset_id, kind=kind, payload=body)
    signature = keeper.sign(seq, digest) if keeper is not None else None
    entry = repo.insert_entry(session, head, seq=seq, at=at, dataset_id=dataset_id, kind=kind,
                              payload=body, prev_hash=prev_hash, digest=digest,
                              signature=signature,
                              key_id=keeper.key_id if keeper is not None else None)
    if keeper is not None and signature is not None:
        pending.append(keeper.entry_record(
            lineage=int(session.info[_LINEAGE]), seq=seq, at=at, dataset_id=dataset_id,
            kind=kind, payload=body, prev_hash=prev_hash, digest=digest, signature=signature))
    return entry


def install_anchor_hooks(factory: sessionmaker[Session], keeper: ChainKeeper) -> None:
    """Make every session of ``factory`` sign and anchor its entries.

    ``before_commit`` flushes, then appends the transaction's queued records to the anchor
    (still under the chain-head lock, so anchor order is chain order); an anchor failure
    aborts the commit. A rollback drops the queue.
    """
    factory.configure(info={CHAIN_KEY: keeper})

    @event.listens_for(factory, "before_commit")
    def _anchor(session: Session) -> None:
        pending = session.info.get(_PENDING)
        if not pending:
            return
        session.flush()
        chain: ChainKeeper = session.info[CHAIN_KEY]
        chain.anchor.append(pending)
        session.info[_PENDING] = []

    @event.listens_for(factory, "after_soft_rollback")
    def _drop(session: Session, previous_transaction: object) -> None:
        session.info[_PENDING] = []
        session.info.pop(REBASE_KEY, None)


class _Replay:
    """Accumulators of one dataset rebuilt from its entries alone.

    Holds are kept per (reservation, run): a whole-dataset reservation has one run on
    ``"*"`` (it holds on every partition); a per-label one has one run per class, each
    holding only on its class (``label_rdp_outstanding`` in its entries), or on every
    partition when the dataset's labels are not disjoint in its privacy unit.

    The ``budget_created`` entry fixes how charges are routed: ``neighbouring`` (a DP-SGD
    step on a replace-one dataset is charged through group privacy at distance 2,
    :func:`~dpsynth_ledger.accounting.charge_step`) and ``partitions_disjoint`` (absent in
    entries from before it: True).
    """

    def __init__(self, payload: dict[str, Any]) -> None:
        self.order = int(payload["admission_order"])
        self.committed = {p: 0.0 for p in payload["partitions"]}
        self.holds: dict[tuple[str, str], float] = {}
        self.releases: set[str] = set()
        self.sized = payload.get("class_sizes") is not None
        self.relation = str(payload.get("neighbouring", "add_remove"))
        self.disjoint = payload.get("partitions_disjoint", True) is not False

    def charge_of(self, event: dict[str, Any]) -> float:
        """The RDP a recorded DP-SGD event (σ, q, steps) charges to each partition it
        touches: ``steps`` times the dataset's step charge at its order (group privacy on a
        replace-one dataset), rounded up exactly as the ledger charged it."""
        return mul_up(int(event["steps"]), charge_step(float(event["noise_multiplier"]),
                                                       float(event["sample_rate"]), self.order,
                                                       self.relation))

    def reserved(self) -> dict[str, float]:
        out: dict[str, list[float]] = {p: [] for p in self.committed}
        for (_, partition), amount in self.holds.items():
            for p in touched(partition, self.committed, self.disjoint):
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
            amount = self.charge_of(payload["event"])
            run = payload.get("label") if payload.get("per_label") else WHOLE_DATASET
            expected = (set(touched(run, self.committed, self.disjoint)) if run is not None
                        else set())
            if set(payload["rdp_delta"]) != expected:
                problems.append(f"entry {seq}: charged partitions {sorted(payload['rdp_delta'])}"
                                f" != those its run touches {sorted(expected)}")
            for p, recorded in payload["rdp_delta"].items():
                if recorded != amount:
                    problems.append(f"entry {seq}: charge {recorded} != recomputed {amount}")
                self.committed[p] = add_up(self.committed.get(p, 0.0), float(recorded))
            self._hold(rid, payload)
        elif kind == "histogram_released":  # one Gaussian: every partition, full RDP once
            amount = rdp_at_order(GaussianEvent.model_validate(payload["event"]), self.order,
                                  self.relation)
            self._training_charge(payload, amount, problems, seq, "a histogram release")
            self.releases.add(payload["release_id"])
        elif kind == CENTRAL_IMAGES_RELEASED:
            self._central_images(payload, problems, seq)
        elif kind in ("dp_evaluation_released", "dp_evaluation_refused"):
            self.committed.setdefault(HOLDOUT, 0.0)  # the row is created at the first one
            if kind == "dp_evaluation_released":
                self._dp_evaluation(payload, problems, seq)
        elif kind == "class_sizes_set":
            if self.sized:
                problems.append(f"entry {seq}: class sizes set twice")
            if payload.get("release_id") not in self.releases:
                problems.append(f"entry {seq}: class sizes name no earlier histogram release")
            self.sized = True
        elif kind == "reservation_closed":
            for key in [k for k in self.holds if k[0] == rid]:
                del self.holds[key]

    def _central_images(self, payload: dict[str, Any], problems: list[str], seq: int) -> None:
        """A central-image release: its event's RDP at the order under the dataset's relation
        (a Gaussian of the relation's sensitivity; subsampled queries as DP-SGD, through group
        privacy on a replace-one dataset), charged once to every TRAINING partition."""
        try:
            ev = central_event(payload["event"])
            bound = central_image_bound(int(payload["image_size"]), int(payload["channels"]),
                                        int(payload["downsample"]))
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"entry {seq}: a central-image release without a valid event or "
                            f"image shape ({type(exc).__name__})")
            return
        if float(payload.get("bound", -1.0)) != bound:
            problems.append(f"entry {seq}: recorded bound {payload.get('bound')} != the image "
                            f"shape's public bound {bound}")
        if isinstance(ev, GaussianEvent):
            expected = central_image_sensitivity(bound, self.relation)
            if ev.sensitivity != expected or str(ev.neighbouring) != self.relation:
                problems.append(f"entry {seq}: a central-image release's sensitivity must be "
                                f"{expected} under {self.relation}, not {ev.sensitivity} "
                                f"under {ev.neighbouring}")
        amount = rdp_at_order(ev, self.order, self.relation)
        self._training_charge(payload, amount, problems, seq, "a central-image release")

    def _training_charge(self, payload: dict[str, Any], amount: float, problems: list[str],
                         seq: int, what: str) -> None:
        """A one-shot release charged ``amount`` once to every TRAINING partition: check the
        recorded partitions and amounts, and apply them."""
        if set(payload["rdp_delta"]) != set(touched(WHOLE_DATASET, self.committed)):
            problems.append(f"entry {seq}: {what} must charge every training partition, not "
                            f"{sorted(payload['rdp_delta'])}")
        for p, recorded in payload["rdp_delta"].items():
            if recorded != amount:
                problems.append(f"entry {seq}: charge {recorded} != recomputed {amount}")
            self.committed[p] = add_up(self.committed.get(p, 0.0), float(recorded))

    def _dp_evaluation(self, payload: dict[str, Any], problems: list[str], seq: int) -> None:
        """A DP evaluation: one Gaussian of sensitivity √(number of metrics), charged to the
        held-out partition ALONE at its full RDP."""
        event = GaussianEvent.model_validate(payload["event"])
        amount = rdp_at_order(event, self.order, self.relation)
        if abs(event.sensitivity - math.sqrt(len(payload.get("metrics") or []))) > 1e-12:
            problems.append(f"entry {seq}: a DP evaluation's sensitivity must be √(number of "
                            f"metrics), not {event.sensitivity}")
        if set(payload["rdp_delta"]) != {HOLDOUT}:
            problems.append(f"entry {seq}: a DP evaluation must charge the held-out partition "
                            f"alone, not {sorted(payload['rdp_delta'])}")
        for p, recorded in payload["rdp_delta"].items():
            if recorded != amount:
                problems.append(f"entry {seq}: charge {recorded} != recomputed {amount}")
            self.committed[p] = add_up(self.committed.get(p, 0.0), float(recorded))

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


def _restored(replay: _Replay, payload: dict[str, Any], problems: list[str], seq: int) -> None:
    """Replay a ``restored_charge`` entry (reconciliation after a restore).

    A re-applied anchored charge carries the anchored entry's own (signed) ``rdp_delta``; a
    charge of an api job the ledger lost carries its DP-SGD event, recomputed here.
    """
    ev = payload.get("event")
    if payload.get("source") == "api_job" and isinstance(ev, dict):
        amount = replay.charge_of(ev)  # group privacy on a replace-one dataset
        for recorded in payload["rdp_delta"].values():
            if recorded != amount:
                problems.append(f"entry {seq}: restored charge {recorded} != recomputed {amount}")
    for p, recorded in payload["rdp_delta"].items():
        if p == HOLDOUT:  # a restored DP evaluation charge (the row is created with it)
            replay.committed.setdefault(HOLDOUT, 0.0)
        if p not in replay.committed:
            problems.append(f"entry {seq}: restored charge names unknown partition {p!r}")
            continue
        replay.committed[p] = add_up(replay.committed[p], float(recorded))
    if payload.get("release_id"):
        replay.releases.add(str(payload["release_id"]))


def _check_signature(entry: Entry, keeper: ChainKeeper, signed_seen: bool,
                     problems: list[str]) -> bool:
    """Check one entry's signature; True when it is signed (and counted)."""
    if entry.signature is None:
        if signed_seen:
            problems.append(f"entry {entry.seq}: unsigned after signed entries")
        return False
    if entry.key_id not in keeper.verifying_keys:
        problems.append(f"entry {entry.seq}: signed by key {entry.key_id}, neither the chain "
                        f"key {keeper.key_id} nor a retired one")
    elif not keeper.verify(entry.seq, entry.hash, entry.signature, entry.key_id):
        problems.append(f"entry {entry.seq}: signature invalid (forged, or the entry's seq or "
                        "hash altered)")
    return True


def _check_record(record: dict[str, Any], keeper: ChainKeeper, problems: list[str]) -> None:
    """One anchor record: well formed, its content hashes to its hash, its signature holds."""
    where = f"anchor {record.get('where', '?')}"
    try:
        kind, seq, digest = str(record["type"]), int(record["seq"]), str(record["hash"])
        signature, key_id = str(record["signature"]), str(record["key_id"])
        lineage = int(record["lineage"])
    except (KeyError, TypeError, ValueError):
        problems.append(f"{where}: not a well-formed anchor record")
        return
    public = keeper.verifying_keys.get(key_id)
    if public is None:
        problems.append(f"{where} (entry {seq}): signed by key {key_id}, neither "
                        f"{keeper.key_id} nor a retired chain key")
        return
    if kind == "rebase":
        if not verify_message(rebase_message(lineage, seq, digest), signature, public):
            problems.append(f"{where}: rebase record's signature invalid (edited)")
        return
    try:
        content = entry_hash(str(record["prev_hash"]), seq=seq,
                             dataset_id=str(record["dataset_id"]), kind=str(record["kind"]),
                             payload=record["payload"])
    except (KeyError, TypeError, ValueError):
        problems.append(f"{where} (entry {seq}): not a well-formed entry record")
        return
    if content != digest:
        problems.append(f"{where} (entry {seq}): content does not hash to its recorded hash "
                        "(edited)")
    if not keeper.verify(seq, digest, signature, key_id):
        problems.append(f"{where} (entry {seq}): signature invalid (edited or forged)")


def check_anchor(keeper: ChainKeeper, hashes: dict[int, str], head_seq: int, head_hash: str,
                 problems: list[str]) -> AnchorStatus:
    """Compare the anchor log with the database's entries (``hashes``: seq → hash).

    Every record's signature (and an entry record's content hash) is checked; every entry of
    the current lineage, and the entry its rebase record starts from, must be the database's
    entry of the same seq; and the anchored head must not be ahead of the database.
    """
    records = keeper.anchor.records()
    for record in records:
        if record.get("type") == "malformed":
            problems.append(f"anchor {record.get('where')}: not a JSON record")
        else:
            _check_record(record, keeper, problems)
    wellformed = [r for r in records if r.get("type") in ("entry", "rebase")]
    current = wellformed[-1].get("lineage") if wellformed else 0
    start = 0
    for i, record in enumerate(wellformed):
        if record.get("type") == "rebase" and record.get("lineage") == current:
            start = i
    for record in wellformed[start:]:
        if record.get("lineage") != current:
            continue
        seq, where = int(record["seq"]), f"anchor {record.get('where')}"
        if seq == 0 and record.get("type") == "rebase":
            continue
        stored = hashes.get(seq)
        if stored is None:
            problems.append(f"{where}: anchored entry {seq} is missing from the database")
        elif stored != record.get("hash"):
            problems.append(f"{where}: anchored entry {seq} differs from the database's entry "
                            f"{seq} (hash {str(record.get('hash'))[:12]} != {stored[:12]})")
    status = keeper.status(head_seq, head_hash, hashes.get)
    if status.behind:
        problems.append(f"the database (head {head_seq}) is behind the anchored head "
                        f"({status.anchored_seq}): run `dpsynth ledger reconcile-after-restore`")
    elif status.diverged:
        problems.append(f"the database's head ({head_seq}) is not the anchored head "
                        f"({status.anchored_seq}): the chain diverged from its anchor")
    return status


def verify_chain(session: Session, keeper: ChainKeeper | None = None) -> VerifyReport:
    """Recompute every hash and link, every charge, and every accumulator from the entries;
    check every signature and the anchor (with the session's :class:`ChainKeeper`)."""
    keeper = keeper if keeper is not None else session.info.get(CHAIN_KEY)
    problems: list[str] = []
    prev, count, last_seq = GENESIS_HASH, 0, 0
    replays: dict[str, _Replay] = {}
    hashes: dict[int, str] = {}
    signed_seen, signatures = False, 0
    for entry in repo.entries(session):
        count += 1
        hashes[entry.seq] = entry.hash
        if keeper is not None and _check_signature(entry, keeper, signed_seen, problems):
            signed_seen, signatures = True, signatures + 1
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
        if entry.kind == RECONCILED:
            continue
        replay = replays.get(entry.dataset_id)
        if replay is None:
            problems.append(f"entry {entry.seq}: dataset has no budget_created entry")
            continue
        if entry.kind == RESTORED_CHARGE:
            _restored(replay, payload, problems, entry.seq)
        else:
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
    anchor = (check_anchor(keeper, hashes, head.seq, head.hash, problems)
              if keeper is not None else None)
    return VerifyReport(ok=not problems, entries=count, head=prev, problems=problems,
                        details={"datasets": len(replays)}, signatures_checked=signatures,
                        anchor=anchor)


def anchor_status(session: Session, keeper: ChainKeeper) -> AnchorStatus:
    """The database's head against the anchored head (for ``/readyz`` and ``/v1/anchor``)."""
    head = repo.chain_head(session)

    def hash_at(seq: int) -> str | None:
        rows = repo.entries(session, after_seq=seq - 1, limit=1)
        return rows[0].hash if rows and rows[0].seq == seq else None

    return keeper.status(head.seq, head.hash, hash_at)


def adopt_existing_chain(session: Session, keeper: ChainKeeper) -> bool:
    """Anchor an existing chain on first use: an empty anchor log and a non-empty database
    get a rebase record naming the database's head (trust on first use; logged).

    Returns:
        True when the record was written.
    """
    head = repo.lock_chain_head(session)
    if head.seq == 0 or keeper.anchor.last() is not None:
        session.rollback()
        return False
    keeper.anchor.append([keeper.rebase_record(
        lineage=1, seq=head.seq, entry_hash=head.hash,
        superseded=AnchoredHead(0, 0, GENESIS_HASH), reason="adopted an unanchored chain")])
    session.commit()
    return True
