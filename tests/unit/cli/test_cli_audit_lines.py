"""The "privacy audit" line beside a DP model and an evaluation report (issue 19, item 2):
``dpsynth models show`` and ``dpsynth report`` print it the way ``dpsynth jobs show`` does
for a finetune (one formatter), "not audited" with the command that would audit it, and
nothing for a model no finetune produced."""

from __future__ import annotations

import httpx
from dpsynth_api.models.schemas import ModelOut
from dpsynth_cli.main import app
from dpsynth_cli.summaries import audit_summary_line
from dpsynth_shared.evaluation import EvaluationReport
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, model_body
from tests.unit.cli.test_evaluate_cli import REPORT

runner = CliRunner()
WIDE = {"COLUMNS": "240"}
AUDITED = {"status": "audited", "recipe_family": "trainable=full,K=1", "audit_job_id": "job_a",
           "mode": "white_box", "audited_job_id": "job_f", "same_job": True,
           "verdict": "consistent", "epsilon_lower_bound": 0.3, "claimed_epsilon": 2.0,
           "max_certifiable_epsilon": 4.2, "engine": "BookKeepingEngine", "device": "cpu",
           "code_version": "0.1.0", "finished_at": "2026-11-27T19:00:00Z"}
NOT_AUDITED = {"status": "not_audited", "recipe_family": "trainable=full,K=1"}


def _show(api: FakeApi, **fields: object) -> str:
    body = model_body("mdl_dp", source="job", dp=True, job_ids=["job_f"],
                      produced_by_job_id="job_f", job_epsilon=1.0, delta=1e-5, **fields)
    ModelOut.model_validate(body)  # the fake body is the api's schema
    api.route("GET", "/v1/models/mdl_dp", body)
    result = runner.invoke(app, ["models", "show", "mdl_dp"], env=WIDE)
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


def test_models_show_prints_the_producing_finetunes_audit(api: FakeApi) -> None:
    out = _show(api, audit=NOT_AUDITED)
    assert ("privacy audit not audited (trainable=full,K=1): dpsynth jobs submit "
            "examples/audit.yaml --set job_id=job_f") in out
    out = _show(api, audit=AUDITED)
    assert "privacy audit consistent: measured epsilon >= 0.3 against a claimed 2" in out
    assert ("(audit job_a of its finetune job_f, BookKeepingEngine, cpu, version 0.1.0, "
            "2026-11-27T19:00:00Z)") in out
    out = _show(api, audit={**AUDITED, "same_job": False, "audited_job_id": "job_g"})
    assert "(audit job_a of job job_g," in out
    assert "privacy audit" not in _show(api, audit=None)


def test_report_prints_the_audit_as_of_the_evaluation(api: FakeApi) -> None:
    report = {**REPORT, "audit": AUDITED}
    EvaluationReport.model_validate(report)
    api.route("GET", "/v1/jobs/job_ev/report", lambda r: httpx.Response(200, json=report))
    result = runner.invoke(app, ["report", "job_ev"], env=WIDE)
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert ("privacy audit of the model's finetune, when evaluated: consistent: measured "
            "epsilon >= 0.3 against a claimed 2 (audit job_a of the model's finetune") in out
    api.route("GET", "/v1/jobs/job_ev/report", lambda r: httpx.Response(200, json=REPORT))
    assert "privacy audit" not in runner.invoke(app, ["report", "job_ev"], env=WIDE).stdout


def test_one_formatter_for_every_view() -> None:
    assert audit_summary_line(None, this="this job") is None
    assert audit_summary_line({"status": "pending"}, this="this job") is None
    line = audit_summary_line(NOT_AUDITED, this="this job")
    assert line is not None and line.endswith("--set job_id=...")
    audited = audit_summary_line({**AUDITED, "key_matches": True}, this="this job")
    assert audited is not None and "not this finetune's key" not in audited
    other = audit_summary_line({**AUDITED, "key_matches": False, "finetune_device": "cuda"},
                               this="this job")
    assert other is not None and "[not this finetune's key: it ran on cuda," in other


def test_the_line_names_the_ranks_of_a_multi_rank_audit_or_finetune() -> None:
    both = audit_summary_line({**AUDITED, "device": "cuda", "world_size": 2}, this="this job")
    assert both is not None and "cuda x 2 ranks" in both
    other = audit_summary_line({**AUDITED, "device": "cuda", "world_size": 1,
                                "key_matches": False, "finetune_device": "cuda",
                                "finetune_world_size": 4}, this="this job")
    assert other is not None and "it ran on cuda x 4 ranks," in other
