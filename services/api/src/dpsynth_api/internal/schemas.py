"""Replies of the internal endpoints not already in :mod:`dpsynth_shared.worker_contract`."""

from __future__ import annotations

from dpsynth_shared.job_states import JobState
from pydantic import BaseModel


class TransitionReply(BaseModel):
    job_id: str
    state: JobState
    attempt: int
