"""The job kinds: one enum for the api, the worker and the contracts between them.

Each kind has its spec in :mod:`dpsynth_shared.job_specs` (whose ``type`` discriminator is
this enum's value), its admission in the api and its runner in the worker's ``RUNNERS``
table, keyed by this enum (docs/architecture.md, "Adding a job kind").
"""

from __future__ import annotations

from enum import StrEnum


class JobType(StrEnum):
    """A job's kind: the ``type`` of its spec, its claim and its record."""

    PRETRAIN = "pretrain"
    FINETUNE = "finetune"
    GENERATE = "generate"
    FEATURE_NET = "feature_net"
    EVALUATE = "evaluate"
    AUDIT = "audit"
    DP_TRAIN = "dp_train"


__all__ = ["JobType"]
