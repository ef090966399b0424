"""Replaying a dataset's ledger entries alone: the accumulators they imply, each charge
recomputed from its recorded DP event (:func:`dpsynth_ledger.chain.verify_chain` compares
them with the stored ones), and the entry kinds the replay knows by name.
"""

from __future__ import annotations

import math
from typing import Any

from dpsynth_shared.central_images import (
    central_image_bound,
    central_image_sensitivity,
    central_image_unit_norm,
)
from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent

from dpsynth_ledger.accounting import (
    HOLDOUT,
    WHOLE_DATASET,
    add_up,
    charge_step,
    mul_up,
    rdp_at_order,
    sum_up,
)
from dpsynth_ledger.book import touched

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


class Replay:
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
        second_moments = bool(payload.get("second_moments", False))
        noise = (ev.sigma if isinstance(ev, GaussianEvent)
                 else ev.noise_multiplier * central_image_unit_norm(bound, second_moments))
        if float(payload.get("noise_std", -1.0)) != noise:
            problems.append(f"entry {seq}: recorded noise std {payload.get('noise_std')} != "
                            f"the event's {noise}")
        if isinstance(ev, GaussianEvent):
            expected = central_image_sensitivity(bound, self.relation,
                                                 second_moments=second_moments)
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


def restored(replay: Replay, payload: dict[str, Any], problems: list[str], seq: int) -> None:
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
