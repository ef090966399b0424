"""Job kinds on the api side: one module per kind, each with one ``admit(ctx, spec)``.

:data:`ADMISSIONS` is keyed by :class:`~dpsynth_shared.job_types.JobType`, the mirror of the
worker's ``RUNNERS`` table (``dpsynth_worker.runners``). Adding a job kind is its spec in
``dpsynth_shared.job_specs``, its value in ``JobType``, one module here and one runner in the
worker, each registered in its table (docs/architecture.md, "Adding a job kind").
"""

from __future__ import annotations

from dpsynth_shared.job_types import JobType

from dpsynth_api.jobs.kinds import (
    audit,
    dp_train,
    evaluate,
    feature_net,
    finetune,
    generate,
    pretrain,
)
from dpsynth_api.jobs.kinds.base import Admission, Admit, AdmitContext

ADMISSIONS: dict[JobType, Admit] = {
    JobType.PRETRAIN: pretrain.admit, JobType.FINETUNE: finetune.admit,
    JobType.GENERATE: generate.admit, JobType.FEATURE_NET: feature_net.admit,
    JobType.EVALUATE: evaluate.admit, JobType.AUDIT: audit.admit,
    JobType.DP_TRAIN: dp_train.admit}

__all__ = ["ADMISSIONS", "Admission", "Admit", "AdmitContext"]
