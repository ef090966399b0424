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

from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.dp_events import GENESIS_HASH, chain_hash
from dpsynth_shared.grants import verify_message
from dpsynth_shared.ledger_contract import AnchorStatus, VerifyReport
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_ledger import repository as repo
from dpsynth_ledger.anchor import AnchoredHead, ChainKeeper, rebase_message
from dpsynth_ledger.chain_replay import CENTRAL_IMAGES_REFUSED as CENTRAL_IMAGES_REFUSED
from dpsynth_ledger.chain_replay import CENTRAL_IMAGES_RELEASED as CENTRAL_IMAGES_RELEASED
from dpsynth_ledger.chain_replay import RECONCILED as RECONCILED
from dpsynth_ledger.chain_replay import RESTORED_CHARGE as RESTORED_CHARGE
from dpsynth_ledger.chain_replay import Replay, restored
from dpsynth_ledger.chain_replay import central_event as central_event
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


def _missing(first: int, last: int, why: str) -> str:
    """The problem line naming the missing entries ``first..last``."""
    which = f"entry {first}" if first == last else f"entries {first}..{last}"
    return f"{which}: missing ({why})"


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
    replays: dict[str, Replay] = {}
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
            replays[entry.dataset_id] = Replay(payload)
            continue
        if entry.kind == RECONCILED:
            continue
        replay = replays.get(entry.dataset_id)
        if replay is None:
            problems.append(f"entry {entry.seq}: dataset has no budget_created entry")
            continue
        if entry.kind == RESTORED_CHARGE:
            restored(replay, payload, problems, entry.seq)
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
