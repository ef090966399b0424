"""The evaluation report's empirical privacy audit (issue 19, item 2): the audit of the
finetune behind the corpus's model that the api put in the claim is copied into
``report.json`` and shown beside the corpus's ε in ``report.html``, escaped; "not audited"
when none had succeeded; nothing when the model is no finetune's (no DP claim to test).
"""

from __future__ import annotations

import json
from typing import Any

from dpsynth_shared.audit_specs import AuditSummary
from dpsynth_shared.evaluation import EvaluationReport
from dpsynth_shared.worker_contract import CorpusRef
from dpsynth_worker.reports import render_html, render_json
from dpsynth_worker.runners import Outcome

from tests.unit.worker.conftest import World
from tests.unit.worker.fakes import MetricsCore
from tests.unit.worker.test_evaluate_runner import (  # the runner tests' fakes and claim
    FakeMetrics,
    _evaluate_claim,
    _report,
    ledger,
)
from tests.unit.worker.test_report_render import _document

__all__ = ["ledger"]  # the evaluation-grant ledger fixture the world is built on

AUDITED = {"status": "audited", "recipe_family": "trainable=full,K=1",
           "audit_job_id": "job_audit", "mode": "white_box", "audited_job_id": "job_ft",
           "same_job": True, "verdict": "consistent", "epsilon_lower_bound": 0.31,
           "claimed_epsilon": 2.0, "max_certifiable_epsilon": 4.2,
           "engine": "BookKeepingEngine <b>", "device": "cpu", "world_size": 1,
           "code_version": "0.1.0", "finished_at": "2026-11-20T10:00:00Z",
           "key_matches": True, "finetune_device": "cpu", "finetune_world_size": 1}
HEADING = "Empirical privacy audit"


def _html(audit: dict[str, Any] | None) -> str:
    return render_html({**_document(visibility="public"), "audit": audit})


def test_an_audited_model_shows_every_figure_of_its_audit_beside_the_epsilon() -> None:
    html = _html(AUDITED)
    start = html.index(HEADING)
    # beside the corpus's privacy figures, before the images compared and the headline
    assert html.index("Privacy of the corpus") < start < html.index("Images compared")
    block = html[start:html.index("Images compared")]
    for shown in ("consistent with its claim", "white_box", "0.31", "4.2", "cpu", "0.1.0",
                  "2026-11-20", "job_audit", "this finetune", "trainable=full,K=1"):
        assert shown in block, shown
    assert "<b>" not in block and "BookKeepingEngine &lt;b&gt;" in block  # escaped
    assert "not a guarantee" in block and "<script" not in html


def test_an_audit_of_another_finetune_of_the_family_names_that_job() -> None:
    html = _html({**AUDITED, "same_job": False, "audited_job_id": "job_other",
                  "verdict": "rejected"})
    block = html[html.index(HEADING):html.index("Images compared")]
    assert "finetune job_other of the same recipe family" in block
    assert 'class="banner nondp">REJECTED' in block


def test_an_audit_of_another_key_says_what_differs() -> None:
    """The finetune ran on a GPU and only a CPU audit exists: shown, and said so."""
    html = _html({**AUDITED, "key_matches": False, "finetune_device": "cuda"})
    block = html[html.index(HEADING):]
    assert "the finetune ran on cuda" in block and "no audit of that key yet" in block
    assert "no audit of that key" not in _html(AUDITED)


def test_not_audited_and_no_finetune() -> None:
    html = _html({"status": "not_audited", "recipe_family": "trainable=lora<x>,K=2"})
    block = html[html.index(HEADING):html.index("Images compared")]
    assert "Not audited" in block and "trainable=lora&lt;x&gt;,K=2" in block
    assert HEADING not in _html(None)  # a model no finetune produced: nothing to audit
    assert HEADING not in render_html(_document(visibility="public"))  # an older document


def test_the_json_report_keeps_the_audit_and_older_documents_still_validate() -> None:
    doc = json.loads(render_json({**_document(), "audit": AUDITED}))
    assert doc["audit"] == {**AUDITED, "finished_at": "2026-11-20T10:00:00Z"}
    assert EvaluationReport.model_validate(_document()).audit is None
    assert doc["report_version"] == 1


def test_the_runner_copies_the_claims_audit_into_both_files(world: World) -> None:
    base = _evaluate_claim(world, visibility="public")
    assert base.corpus is not None
    corpus = CorpusRef.model_validate({**base.corpus.model_dump(), "audit": AUDITED})
    claim = base.model_copy(update={"corpus": corpus})
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    doc = json.loads(_report(world, "json"))
    assert AuditSummary.model_validate(doc["audit"]) == corpus.audit
    html = _report(world, "html").decode()
    assert HEADING in html and "job_audit" in html


def test_a_claim_without_an_audit_writes_none(world: World) -> None:
    claim = _evaluate_claim(world, visibility="public")  # an older api's claim
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    assert json.loads(_report(world, "json"))["audit"] is None
    assert HEADING not in _report(world, "html").decode()
