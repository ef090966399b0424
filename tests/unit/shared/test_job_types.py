"""One JobType for the api, the worker and the contracts (issue 16, item 1)."""

from __future__ import annotations

import typing

from dpsynth_shared.job_specs import JobSpec
from dpsynth_shared.job_types import JobType
from dpsynth_shared.worker_contract import Claim
from dpsynth_worker.runners import RUNNERS


def _spec_types() -> set[str]:
    union = typing.get_args(JobSpec)[0]
    return {typing.get_args(cls.model_fields["type"].annotation)[0]
            for cls in typing.get_args(union)}


def test_every_spec_kind_is_a_job_type_and_has_a_runner() -> None:
    assert _spec_types() == {t.value for t in JobType}
    assert set(RUNNERS) == set(JobType)


def test_a_claim_carries_the_enum_and_serialises_as_its_value() -> None:
    claim = Claim(job_id="job_1", tenant_id="t", attempt=1, type="generate", spec={},
                  lease_ttl_s=60, heartbeat_s=10)
    assert claim.type is JobType.GENERATE and claim.type == "generate"
    assert claim.model_dump(mode="json")["type"] == "generate"
