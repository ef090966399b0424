"""DP events: what each mechanism did, the ledger's unit of record (docs/privacy.md).

The ledger never stores only an epsilon: it stores the mechanism's parameters, so any
accountant (RDP filter, PLD, PRV, a future one) can be recomputed from the record. Events
are immutable, versioned and canonically encoded (sorted keys, no whitespace, floats in
their shortest round-trip form), so the hash chain is reproducible from the data alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Neighbouring(StrEnum):
    """The neighbouring relation a mechanism's analysis assumes."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def canonical(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()


class DpSgdEvent(_Event):
    """``steps`` compositions of a Poisson-subsampled Gaussian mechanism (DP-SGD).

    Attributes:
        noise_multiplier: sigma; the noise std divided by the clipping norm.
        sample_rate: q, each record's inclusion probability per step (exactly what the
            worker's Poisson sampler uses).
        steps: number of logical steps (each one release of a noised gradient sum).
    """

    kind: Literal["dp_sgd"] = "dp_sgd"
    noise_multiplier: float = Field(gt=0)
    sample_rate: float = Field(gt=0, le=1)
    steps: int = Field(ge=0)
    sampling: Literal["poisson"] = "poisson"

    @field_validator("noise_multiplier", "sample_rate")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class GaussianEvent(_Event):
    """A one-shot Gaussian release with the given L2 sensitivity."""

    kind: Literal["gaussian"] = "gaussian"
    sigma: float = Field(gt=0)
    sensitivity: float = Field(gt=0)


class ParallelEvent(_Event):
    """Events on disjoint partitions (labels of the declared domain); composes as the max."""

    kind: Literal["parallel"] = "parallel"
    partitions: dict[str, DpEvent]


DpEvent = Annotated[DpSgdEvent | GaussianEvent | ParallelEvent, Field(discriminator="kind")]
ParallelEvent.model_rebuild()


def canonical_json(value: Any) -> bytes:
    """Canonical JSON: sorted keys, compact separators, UTF-8, no NaN/Infinity."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def chain_hash(previous_hash: str, payload: Any) -> str:
    """Hash of one ledger entry: sha256(previous hash || canonical payload)."""
    h = hashlib.sha256()
    h.update(previous_hash.encode("ascii"))
    h.update(b"\n")
    h.update(canonical_json(payload))
    return h.hexdigest()


GENESIS_HASH = "0" * 64
