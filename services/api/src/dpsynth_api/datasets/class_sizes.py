"""A private dataset's class sizes, released through a charged Gaussian histogram
(docs/privacy.md, "Class sizes are public: declared, or released by a charged DP histogram")."""

from __future__ import annotations

import logging
import math

import numpy as np
from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.release_contract import HistogramRelease, HistogramRequest, SetClassSizes
from dpsynth_shared.secure_noise import NormalSource, SecureNormal
from sqlalchemy.orm import Session

from dpsynth_api.datasets import repository as repo
from dpsynth_api.datasets.schemas import ClassSizesReleaseIn, ClassSizesReleaseOut
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tables import Dataset
from dpsynth_api.tenants.security import Principal

log = logging.getLogger(__name__)


def noisy_class_sizes(counts: dict[str, int], sigma: float, declared_size: int,
                      rng: NormalSource | None = None) -> dict[str, int]:
    """Post-process a Gaussian histogram into public class sizes.

    Each true count gets N(0, σ²) noise; the size is ``min(N̂, max(1, ceil(noisy)))``
    (at least 1 so q_c is defined, at most N̂ so δ < 1/N̂ ≤ 1/N̂_c). The noise comes from
    the OS CSPRNG (:class:`dpsynth_shared.secure_noise.SecureNormal`), never from a user seed.
    """
    rng = rng if rng is not None else SecureNormal()
    names = sorted(counts)
    noisy = np.asarray([counts[c] for c in names], dtype=np.float64) + rng.normal(
        0.0, sigma, size=len(names))
    return {c: min(declared_size, max(1, math.ceil(float(v))))
            for c, v in zip(names, noisy, strict=True)}


def _release_out(dataset: Dataset, release: HistogramRelease, *, dry_run: bool,
                 sizes: dict[str, int] | None) -> ClassSizesReleaseOut:
    return ClassSizesReleaseOut(
        dataset_id=dataset.id, dry_run=dry_run, charged=release.charged,
        release_id=release.release_id, class_sizes=sizes,
        class_sizes_source="dp_histogram" if sizes is not None else None,
        target_epsilon=release.target_epsilon, epsilon=release.epsilon,
        sigma=release.event.sigma, sensitivity=release.event.sensitivity,
        delta=release.delta, admission_order=release.admission_order,
        rdp_charge=release.rdp_charge, admissible=release.admissible,
        dataset_epsilon_spent_before=release.dataset_epsilon_spent_before,
        dataset_epsilon_spent_after=release.dataset_epsilon_spent_after,
        dataset_epsilon_remaining_after=release.dataset_epsilon_remaining_after)


def release_class_sizes(session: Session, *, principal: Principal, ledger: LedgerPort,
                        dataset_id: str, body: ClassSizesReleaseIn) -> ClassSizesReleaseOut:
    """Release a private dataset's class sizes through a charged Gaussian histogram.

    Order (never under-count): the ledger calibrates σ, admits the release through the
    dataset's filter and commits its charge on every partition; only then are the noisy
    counts drawn (from the true per-class counts recorded at ingest) and post-processed into
    sizes, which the ledger records on the budget (a chained ``class_sizes_set`` entry) and
    the api on the dataset (``class_sizes_source: dp_histogram``). The dataset row is locked
    throughout, so two releases of one dataset are serialised.

    If setting the sizes fails after the charge, the charge stays: when the ledger did not
    record them, a retry is a NEW release (charged again); when the ledger recorded them but
    the api could not store them, a retry adopts the ledger's sizes without a new charge.

    Raises:
        NotFound: another tenant's or an unknown dataset.
        DpsynthError: ``invalid_request`` for a public dataset; ``conflict`` when the dataset
            already has class sizes.
        BudgetExhausted: 409 from the ledger's filter (nothing charged).
    """
    dataset = repo.lock_for_tenant(session, tenant_id=principal.tenant_id,
                                   dataset_id=dataset_id)
    if dataset is None:
        raise NotFound("dataset", dataset_id)
    if dataset.visibility != "private":
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "a public dataset has no privacy budget: "
                           "its class counts are public already")
    if (dataset.budget_id or dataset.id) != dataset.id:
        raise DpsynthError(ErrorCode.INVALID_REQUEST,
                           f"dataset {dataset.id} charges the budget of dataset "
                           f"{dataset.budget_id}, whose class partitions and sizes are that "
                           "dataset's; release class sizes there", budget_id=dataset.budget_id)
    if dataset.class_sizes is not None:
        raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has public class sizes",
                           class_sizes_source=dataset.class_sizes_source)
    if not body.dry_run:
        recorded = ledger.get_budget(dataset.id).class_sizes
        if recorded is not None:  # an earlier release reached the ledger but not this row
            dataset.class_sizes, dataset.class_sizes_source = dict(recorded), "dp_histogram"
            session.commit()
            raise DpsynthError(ErrorCode.CONFLICT, "the dataset already has public class "
                               "sizes (released earlier; now stored)",
                               class_sizes=dict(recorded), class_sizes_source="dp_histogram")
    release = ledger.release_histogram(dataset.id, HistogramRequest(
        target_epsilon=body.target_epsilon, dry_run=body.dry_run))
    if body.dry_run:
        session.rollback()
        return _release_out(dataset, release, dry_run=True, sizes=None)
    assert release.release_id is not None and release.charged
    # the charge is committed: from here on the counts may be touched
    sizes = noisy_class_sizes({c: int(dataset.class_counts.get(c, 0))
                               for c in dataset.class_names},
                              release.event.sigma, dataset.declared_size)
    dataset.class_sizes, dataset.class_sizes_source = sizes, "dp_histogram"
    session.flush()
    ledger.set_class_sizes(dataset.id, SetClassSizes(class_sizes=sizes,
                                                     release_id=release.release_id))
    session.commit()
    log.info("class sizes released", extra={"dataset_id": dataset.id,
                                             "release_id": release.release_id})
    return _release_out(dataset, release, dry_run=False, sizes=sizes)
