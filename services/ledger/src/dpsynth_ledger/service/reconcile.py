"""Use case: reconcile the ledger with its anchor after a database restore.

A restored backup lacks every entry written after it was taken: budgets created, leases and
histogram releases charged, limits lowered. Their signed copies are in the anchor log
(:mod:`dpsynth_ledger.anchor`). Reconciliation, in ONE transaction under every involved
budget row's lock and then the chain head's:

1. re-creates each budget the anchor created and the database lacks (same order, limit,
   delta, partitions: a ``budget_created`` entry with ``restored_from``);
2. re-applies every anchored charge the database lacks (``lease_granted``,
   ``histogram_released``, ``dp_evaluation_released``, ``central_images_released``, and
   the ``restored_charge`` entries of an earlier, uncommitted reconciliation), each ONCE,
   as a new chained ``restored_charge`` entry that carries the anchored entry's own signed
   ``rdp_delta`` and names its lineage, seq and hash;
3. re-applies lost class sizes and lowered limits, and re-records lost non-DP evaluation
   reads (``evaluation_authorised`` / ``evaluation_read``: their rows back, never charged);
4. closes every open reservation the lost entries touched (its run cannot resume against a
   rewound reservation row; the job's granted steps are already charged by step 2);
5. charges every api DP job whose reservation neither the database nor the anchor knows:
   its reserved steps at its σ and q, on every partition (conservative);
6. writes a ``reconciled`` entry, and the anchor gets a rebase record first, so later heads
   are compared with the new lineage while the old one stays in the log.

Afterwards every dataset's committed RDP is at least its anchored committed RDP (the lost
charges are added on top of what the backup held), so its spent epsilon is at least what it
was at the anchored head. Failed commits of the past may be charged twice: over-counting is
the only error this allows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import (
    ApiJobRecord,
    ReconcileReport,
    ReconcileRequest,
    ReservationState,
)
from sqlalchemy.orm import Session

from dpsynth_ledger import repository as repo
from dpsynth_ledger.accounting import HOLDOUT, WHOLE_DATASET, add_up, charge_step, mul_up
from dpsynth_ledger.anchor import ChainKeeper
from dpsynth_ledger.book import (
    disjoint_of,
    figures,
    refresh_reserved,
    runs,
    snapshot,
    sync_totals,
    touched,
)
from dpsynth_ledger.chain import (
    CENTRAL_IMAGES_REFUSED,
    CENTRAL_IMAGES_RELEASED,
    REBASE_KEY,
    RECONCILED,
    RESTORED_CHARGE,
    anchor_status,
    append_entry,
    entry_hash,
)
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.models import Budget
from dpsynth_ledger.service import evaluations
from dpsynth_ledger.service.dp_evaluations import holdout_accumulator
from dpsynth_ledger.service.reservations import write_entry

CHARGES = ("lease_granted", "histogram_released", "dp_evaluation_released",
           CENTRAL_IMAGES_RELEASED, RESTORED_CHARGE)
INFORMATIONAL = ("reservation_refused", "extension_refused", "histogram_refused",
                 "dp_evaluation_refused", CENTRAL_IMAGES_REFUSED,
                 "read_grant", "lease_ended", "reservation_accepted", "extension_accepted",
                 "reservation_closed", RECONCILED, "warning_fraction_set")


def _valid(record: dict[str, Any], keeper: ChainKeeper) -> bool:
    """An entry record whose content hashes to its hash, signed by the chain key or a
    retired one (records anchored before a key rotation)."""
    try:
        digest = entry_hash(str(record["prev_hash"]), seq=int(record["seq"]),
                            dataset_id=str(record["dataset_id"]), kind=str(record["kind"]),
                            payload=record["payload"])
        return (digest == record["hash"]
                and keeper.verify(int(record["seq"]), digest, str(record["signature"]),
                                  str(record.get("key_id"))))
    except (KeyError, TypeError, ValueError):
        return False


def _origin(record: dict[str, Any]) -> str:
    """The hash of the original anchored entry a record stands for (a restored copy names
    its original, so a charge is re-applied once however often it was restored)."""
    restored = record["payload"].get("restored_from")
    return str(restored["hash"]) if isinstance(restored, dict) else str(record["hash"])


def _spent(session: Session) -> dict[str, float]:
    out = {}
    for budget in repo.all_budgets(session):
        accs = repo.accumulators(session, budget.dataset_id)
        out[budget.dataset_id] = float(figures(budget, accs)["dataset_epsilon_spent"])
    return out


def reconcile(session: Session, *, request: ReconcileRequest,
              ctx: LedgerContext) -> ReconcileReport:
    """Re-charge what the anchor and the api know and the database lost; re-base the anchor.

    Raises:
        DpsynthError: ``service_unavailable`` when the ledger has no chain keeper.
    """
    keeper = ctx.chain
    if keeper is None:
        raise DpsynthError(ErrorCode.SERVICE_UNAVAILABLE, "the ledger has no anchor configured")
    status = anchor_status(session, keeper)
    spent_before = _spent(session)
    db_entries = repo.entries(session)
    known = {e.hash for e in db_entries}
    for e in db_entries:
        restored = e.payload.get("restored_from")
        if isinstance(restored, dict):
            known.add(str(restored["hash"]))
    records = [r for r in keeper.anchor.records() if r.get("type") == "entry"]
    notes: list[str] = []
    invalid = {id(r) for r in records if not _valid(r, keeper)}
    if invalid:
        notes.append(f"{len(invalid)} anchor record(s) failed their hash or signature check and "
                     "were not re-applied; see GET /v1/chain/verify")
    lost: list[dict[str, Any]] = []
    seen: set[str] = set()
    for record in records:
        if id(record) in invalid or record["hash"] in known:
            continue
        origin = _origin(record)
        if origin in known or origin in seen:
            continue
        seen.add(origin)
        lost.append(record)
    reservations_named = {str(r["payload"]["reservation_id"]) for r in lost
                          if r["payload"].get("reservation_id")}
    anchored_reservations = {str(r["payload"]["reservation_id"]) for r in records
                             if r["payload"].get("reservation_id")}
    # api jobs whose reservation neither the database nor the anchor knows
    orphans = [j for j in request.api_jobs if j.reservation_id
               and repo.get_reservation(session, j.reservation_id) is None
               and j.reservation_id not in anchored_reservations]
    datasets = sorted({str(r["dataset_id"]) for r in lost} | {j.dataset_id for j in orphans})
    session.commit()  # end the read transaction; everything below is under the locks

    budgets: dict[str, Budget] = {}
    for dataset_id in datasets:  # budget rows first (sorted), then the chain head
        budget = repo.lock_budget(session, dataset_id)
        if budget is not None:
            budgets[dataset_id] = budget
    if status.behind or status.diverged:
        session.info[REBASE_KEY] = keeper.rebase_record(
            lineage=keeper.head().lineage + 1, seq=status.local_seq,
            entry_hash=status.local_hash, superseded=keeper.head(),
            reason="reconciled after restore")
    replayed = 0
    for record in lost:
        replayed += _reapply(session, record, budgets, notes)
    closed = _close_touched(session, reservations_named, budgets)
    recharged: list[str] = []
    for job in orphans:
        if _recharge_job(session, job, budgets, notes):
            recharged.append(job.job_id)
    head_before = status.local_seq
    spent_after = _spent(session)
    append_entry(session, dataset_id=WHOLE_DATASET, kind=RECONCILED, payload={
        "anchored_seq": status.anchored_seq, "anchored_hash": status.anchored_hash,
        "head_seq_before": head_before, "head_hash_before": status.local_hash,
        "entries_replayed": replayed, "reservations_closed": closed,
        "jobs_recharged": recharged, "spent_before": spent_before, "spent_after": spent_after,
        "notes": notes})
    head_after = repo.chain_head(session).seq
    session.commit()
    return ReconcileReport(
        ok=not invalid and all(j.job_id in recharged for j in orphans),
        anchored_seq=status.anchored_seq, head_seq_before=head_before,
        head_seq_after=head_after, entries_replayed=replayed, jobs_recharged=recharged,
        spent_before=spent_before, spent_after=spent_after,
        notes=[*notes, *(f"closed reservation {r} (lost entries touched it)" for r in closed)])


def _restored_from(record: dict[str, Any]) -> dict[str, Any]:
    restored = record["payload"].get("restored_from")
    if isinstance(restored, dict):
        return restored
    return {"lineage": record.get("lineage"), "seq": record["seq"], "hash": record["hash"]}


def _reapply(session: Session, record: dict[str, Any], budgets: dict[str, Budget],
             notes: list[str]) -> int:
    """Re-apply one lost anchored entry; 1 when it wrote an entry."""
    kind, payload = str(record["kind"]), record["payload"]
    dataset_id = str(record["dataset_id"])
    origin = _restored_from(record)
    if kind == "budget_created":
        if dataset_id in budgets or repo.get_budget(session, dataset_id) is not None:
            return 0
        budgets[dataset_id] = _recreate_budget(session, dataset_id, payload, origin)
        return 1
    budget = budgets.get(dataset_id)
    if budget is None:
        if kind in CHARGES or kind in evaluations.KINDS:
            what = "a charge" if kind in CHARGES else "an evaluation read"
            notes.append(f"entry {record['seq']}: {what} of dataset {dataset_id}, which has "
                         "no budget in the database or the anchor: not re-applied")
        return 0
    accs = repo.accumulators(session, dataset_id)
    if kind in CHARGES and HOLDOUT in payload["rdp_delta"]:  # a lost DP evaluation charge
        accs = holdout_accumulator(session, dataset_id)
    if kind in CHARGES:
        delta = {p: float(v) for p, v in payload["rdp_delta"].items() if p in accs}
        for p, amount in delta.items():
            accs[p].committed = add_up(accs[p].committed, amount)
        append_entry(session, dataset_id=dataset_id, kind=RESTORED_CHARGE, payload={
            "source": "anchor", "restored_from": origin,
            "restored_kind": payload.get("restored_kind", kind),
            "job_id": payload.get("job_id"), "reservation_id": payload.get("reservation_id"),
            "label": payload.get("label"),
            "release_id": payload.get("release_id"), "event": payload.get("event"),
            "steps": payload.get("steps"), "rdp_delta": delta,
            "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
        return 1
    if kind in evaluations.KINDS:  # a non-DP read: re-recorded, never charged
        at = record.get("at")
        return evaluations.restore(session, budget, kind, payload, origin,
                                   datetime.fromisoformat(at) if isinstance(at, str) else None)
    if kind == "class_sizes_set" and budget.class_sizes is None:
        budget.class_sizes = payload.get("class_sizes")
        append_entry(session, dataset_id=dataset_id, kind="class_sizes_set", payload={
            **{k: v for k, v in payload.items() if k not in ("v", "at", "dataset_id", "kind")},
            "restored_from": origin})
        return 1
    if kind == "limit_lowered" and float(payload["epsilon_limit"]) < budget.epsilon_limit:
        before, rdp_before = budget.epsilon_limit, budget.rdp_budget
        budget.epsilon_limit = float(payload["epsilon_limit"])
        budget.rdp_budget = min(rdp_before, float(payload["rdp_budget"]))
        append_entry(session, dataset_id=dataset_id, kind="limit_lowered", payload={
            "epsilon_limit_before": before, "epsilon_limit": budget.epsilon_limit,
            "rdp_budget_before": rdp_before, "rdp_budget": budget.rdp_budget,
            "admission_order": budget.admission_order, "conversion": payload.get("conversion"),
            "below_spent": False, "figures": figures(budget, accs), "restored_from": origin})
        return 1
    if kind not in INFORMATIONAL and kind not in ("class_sizes_set", "limit_lowered"):
        notes.append(f"entry {record['seq']}: kind {kind!r} is not re-applied")
    return 0


def _recreate_budget(session: Session, dataset_id: str, payload: dict[str, Any],
                     origin: dict[str, Any]) -> Budget:
    """The budget a lost ``budget_created`` entry made, with the same fixed parameters."""
    partitions = list(payload["partitions"])
    budget = Budget(
        dataset_id=dataset_id, tenant_id=str(payload["tenant_id"]),
        epsilon_limit=float(payload["epsilon_limit"]), delta=float(payload["delta"]),
        declared_size=int(payload["declared_size"]), neighbouring=str(payload["neighbouring"]),
        admission_order=int(payload["admission_order"]),
        rdp_budget=float(payload["rdp_budget"]), created_at=datetime.now(UTC),
        class_sizes=payload.get("class_sizes"),
        privacy_unit=str(payload.get("privacy_unit", "image")),
        partitions_disjoint=bool(payload.get("partitions_disjoint", True)),
        warning_fraction=float(payload.get("warning_fraction", 0.8)),
        epsilon_limit_initial=float(payload.get("epsilon_limit_initial",
                                                payload["epsilon_limit"])))
    repo.insert_budget(session, budget, partitions)
    body = {k: v for k, v in payload.items() if k not in ("v", "at", "dataset_id", "kind")}
    append_entry(session, dataset_id=dataset_id, kind="budget_created",
                 payload={**body, "restored_from": origin})
    return budget


def _close_touched(session: Session, reservation_ids: set[str],
                   budgets: dict[str, Budget]) -> list[str]:
    """Close each open reservation the lost entries touched (outcome ``failed``)."""
    closed = []
    for rid in sorted(reservation_ids):
        res = repo.get_reservation(session, rid)
        if res is None or res.state == ReservationState.CLOSED:
            continue
        budget = budgets.get(res.dataset_id)
        if budget is None:
            continue
        released = res.rdp_outstanding
        released_by_label = {p.partition: p.rdp_outstanding for p in res.parts}
        res.state, res.outcome, res.closed_at = ReservationState.CLOSED, "failed", \
            datetime.now(UTC)
        for run in runs(res):
            run.rdp_outstanding = 0.0
        sync_totals(res)
        accs = repo.accumulators(session, budget.dataset_id)
        refresh_reserved(accs, repo.reservations_of(session, budget.dataset_id),
                         disjoint_of(budget))
        extra: dict[str, Any] = {}
        if res.per_label:
            extra["rdp_released_by_label"] = released_by_label
        write_entry(session, budget, res, "reservation_closed", outcome="failed",
                    steps=res.steps_granted, rdp_released=released,
                    steps_released=res.steps_reserved - res.steps_granted,
                    reason="reconciled after restore: entries after the backup touched it",
                    **extra)
        closed.append(rid)
    return closed


def _recharge_job(session: Session, job: ApiJobRecord, budgets: dict[str, Budget],
                  notes: list[str]) -> bool:
    """Charge an api job the ledger lost: its reserved steps at its σ, q on every partition."""
    budget = budgets.get(job.dataset_id)
    if budget is None:
        notes.append(f"job {job.job_id}: dataset {job.dataset_id} has no budget: not charged")
        return False
    if job.noise_multiplier is None or job.sample_rate is None or not job.steps:
        notes.append(f"job {job.job_id}: its plan (noise multiplier, sample rate, steps) is "
                     "unknown: not charged")
        return False
    # the dataset's step charge: group privacy at distance 2 on a replace-one dataset
    amount = mul_up(int(job.steps), charge_step(float(job.noise_multiplier),
                                                float(job.sample_rate), budget.admission_order,
                                                budget.neighbouring))
    accs = repo.accumulators(session, budget.dataset_id)
    delta = {}
    for p in touched(WHOLE_DATASET, accs):
        accs[p].committed = add_up(accs[p].committed, amount)
        delta[p] = amount
    append_entry(session, dataset_id=budget.dataset_id, kind=RESTORED_CHARGE, payload={
        "source": "api_job", "job_id": job.job_id, "reservation_id": job.reservation_id,
        "api_state": job.state,
        "event": DpSgdEvent(noise_multiplier=float(job.noise_multiplier),
                            sample_rate=float(job.sample_rate),
                            steps=int(job.steps)).model_dump(mode="json"),
        "steps": int(job.steps), "rdp_delta": delta,
        "accumulators_after": snapshot(accs), "figures": figures(budget, accs)})
    return True
