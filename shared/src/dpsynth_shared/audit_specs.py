"""The spec of the ``audit`` job kind: a one-run privacy audit of a finetune job's DP-SGD
(Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run").

Part of the job-spec union (:data:`dpsynth_shared.job_specs.JobSpec`, which re-exports it).
Also the ledger's ``POST /v1/gdp-envelopes`` bodies, the claim an audit tests
(re-exported by :mod:`dpsynth_shared.ledger_contract`), and the summary of the latest
matching audit that a finetune's view, a DP model's view and an evaluation report show.
An audit tests the MECHANISM, not the user's data: it runs the audited job's exact DP
settings (the ledger's σ, q, steps and expected batch size; the spec's clipping norm,
trainable set, noise multiplicity and micro-batching; its base model) on a PUBLIC stand-in
dataset, so it reads no private record and charges no budget (docs/privacy.md, "Empirical
audits").
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from dpsynth_shared.spec_base import SpecBase
from dpsynth_shared.text import MAX_INT32, ContractBody


class AuditSpec(SpecBase):
    """A one-run audit of a finetune job's DP-SGD on a public stand-in (white-box by
    default; ``mode: black_box`` for loss canaries scored on the finished model).

    ``canaries`` Dirac gradient canaries, each included with probability 1/2, are observed
    in every step's noisy clipped sum through the engine's own clipping and noise; the
    result is the paper's lower bound on ε (with its δ term) at ``confidence``, the f-DP
    (Gaussian-DP) test of the ledger's claim, and the largest ε those m and that confidence
    could certify at all. A lower bound above the claimed ε means the implementation leaks
    more than it is accounted for.
    """

    type: Literal["audit"] = "audit"
    job_id: str = Field(description="the finetune job whose DP settings are audited (any "
                        "state: its reservation and spec are what is copied)")
    stand_in_dataset_id: str = Field(
        description="a PUBLIC dataset with as many classes as the audited job's dataset (its "
        "images are resized to the base model's size); never a private one")
    mode: Literal["white_box", "black_box"] = Field(
        "white_box", description="white_box: Dirac gradient canaries seen at every step "
        "(tight; catches a sigma or q off by 2x); black_box: noise-image canaries among the "
        "training records, scored by their denoising loss on the finished model (what a "
        "holder of the model could tell; loose, and it says how loose)")
    canaries: int = Field(1000, ge=10, le=1_000_000,
                          description="m; white_box: at most the number of trainable values; "
                          "black_box: at most half the audited N̂ (they are among its records)")
    confidence: float = Field(0.95, ge=0.5, le=0.999)
    audited_class: str | None = Field(
        None, max_length=200, description="a per-label finetune: the class whose run is "
        "audited (default: the class with the largest epsilon, whose claim is the job's); "
        "refused for a whole-dataset finetune")
    seed: int = Field(0, ge=0, le=MAX_INT32, description="the stand-in's sampling, the "
                      "canaries and their inclusion (the DP noise stays OS-keyed)")


class GdpEnvelopeRequest(ContractBody):
    """A DP-SGD run's parameters (add/remove, Poisson sampling) whose Gaussian-DP envelope
    an audit tests (``POST /v1/gdp-envelopes``; stateless, charges nothing)."""

    noise_multiplier: float = Field(gt=0, le=1e4)
    sample_rate: float = Field(gt=0, le=1)
    steps: int = Field(ge=1, le=10_000_000)


class GdpEnvelope(BaseModel):
    """The smallest μ such that μ-GDP's (ε, δ) profile lies above the run's PLD profile on
    a grid of ε (``dpsynth_ledger.accounting.gdp_envelope``), and the PLD's δ at the grid's
    end (``tail_delta``, the additive part of the claim): an audit's claimed μ."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    mu: float
    tail_delta: float
    accountant: str = Field(description="how the envelope was computed")


def recipe_family(*, trainable: str, noise_multiplicity: int,
                  max_physical_batch_size: int | None) -> str:
    """The key under which audits of one recipe are filed and matched (with the engine,
    device kind and code version beside it): the trainable set, the noise multiplicity K and
    the micro-batching, the settings that change the mechanism's code path. The worker
    writes it into an audit's result; the api computes it from a finetune's spec to show the
    latest matching audit, or "not audited"."""
    parts = [f"trainable={trainable}", f"K={noise_multiplicity}"]
    if max_physical_batch_size:
        parts.append(f"physical<={max_physical_batch_size}")
    return ",".join(parts)


AUDIT_VERDICT_WORDS = {
    "consistent": "consistent with its claim (no bound above it)",
    "cannot_bite": "could not have rejected its claim at these canaries and confidence",
    "rejected": "REJECTED: the running code leaks more than claimed (confirmed by a re-run)",
    "unconfirmed": "one run rejected its claim, the confirming re-run did not",
}
"""An audit's verdict in words, one wording for the CLI and the evaluation report."""


class AuditSummary(BaseModel):
    """The latest succeeded audit matching a finetune job (of that job or another of its
    recipe family), or ``not_audited``: what a finetune's view, a DP model's view and an
    evaluation report show (issue 19, item 2). The api fills it from stored audit results;
    the evaluate claim carries it to the worker, which copies it into ``report.json``."""

    status: Literal["audited", "not_audited"]
    recipe_family: str = Field(description="the finetune's recipe family, the match key")
    audit_job_id: str | None = None
    mode: str | None = Field(None, description="white_box / black_box")
    audited_job_id: str | None = Field(None, description="the job whose settings that audit "
                                       "ran: this one, or another of the same family")
    same_job: bool | None = None
    verdict: str | None = Field(None, description="consistent / cannot_bite / rejected / "
                                "unconfirmed (docs/privacy.md)")
    epsilon_lower_bound: float | None = None
    claimed_epsilon: float | None = None
    max_certifiable_epsilon: float | None = None
    engine: str | None = None
    device: str | None = None
    world_size: int | None = Field(None, description="the ranks that audit ran on")
    code_version: str | None = None
    finished_at: datetime | None = None
    key_matches: bool | None = Field(
        None, description="whether that audit ran on the finetune's device kind, on as many "
        "ranks as the finetune, and on this code version (its key, issue 19); false: the "
        "closest audit there is, shown with what differs (an audit of the same key is "
        "preferred whenever one exists)")
    finetune_device: str | None = Field(None, description="the device kind the finetune "
                                        "ran on (cpu / cuda), when it recorded one")
    finetune_world_size: int | None = Field(None, description="the ranks the finetune ran "
                                            "on, when it recorded them")


__all__ = ["AUDIT_VERDICT_WORDS", "AuditSpec", "AuditSummary", "GdpEnvelope",
           "GdpEnvelopeRequest", "recipe_family"]
