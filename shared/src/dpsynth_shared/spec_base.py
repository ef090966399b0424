"""The base of every job spec (:mod:`dpsynth_shared.job_specs`,
:mod:`dpsynth_shared.evaluate_specs`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dpsynth_shared.text import ContractBody, Name

SPEC_VERSION = 1


class SpecBase(ContractBody):
    """What every job spec carries: its version and an optional name."""

    spec_version: Literal[1] = 1
    name: Annotated[Name, Field(min_length=1, max_length=80)] | None = Field(
        None, description="a name for the job in the user's words (lists, the dashboard); "
        "free text the user chose, never derived from data and never sent to the ledger")
