"""``dpsynth features train``, ``dpsynth evaluate``, ``dpsynth report`` and the held-out
upload options, against the in-process fake api (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpsynth_cli.main import app
from dpsynth_cli.views import (
    FD_NAME,
    NON_DP_LINE,
    report_footer,
    report_header,
    report_rows,
)
from dpsynth_client import Client
from dpsynth_shared.evaluation import EvaluationReport
from dpsynth_shared.job_specs import EvaluateSpec, FeatureNetSpec
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, problem

SHA = "ab" * 32
REPORT: dict[str, Any] = {
    "job_id": "job_ev", "corpus_artifact_id": "art_corpus", "generate_job_id": "job_gen",
    "model_id": "mdl_dp", "dataset_id": "ds_priv", "reference_visibility": "private",
    "non_dp": True, "contains_private_images": True,
    "sizes": {"synthetic": 400, "real_train": 800, "real_holdout": 200},
    "headline": {"tstr_accuracy": {"cnn": 0.712, "logreg": 0.655},
                 "real_accuracy": {"cnn": 0.884, "logreg": 0.801},
                 "fd_dpsynth": 12.3456, "fd_dpsynth_real_train": 1.2345,
                 "precision": 0.61, "recall": 0.42, "density": 0.77, "coverage": 0.55,
                 "memorisation_flagged": 3, "memorisation_fraction_closer_to_train": 0.61},
    "classifiers": [
        {"classifier": c, "train_on": on, "accuracy": a, "train_size": 400, "test_size": 200,
         "chance": 0.1}
        for c, on, a in (("cnn", "synthetic", 0.712), ("cnn", "real", 0.884),
                         ("logreg", "synthetic", 0.655), ("logreg", "real", 0.801))],
    "feature_network": {"model_id": "mdl_feat", "architecture": "dpsynth-featnet-v1",
                        "sha256": SHA, "dataset_id": "ds_public", "accuracy": 0.905,
                        "validation_size": 500, "threshold": 0.5, "passed": True},
    "memorisation": [{"space": "pixel", "synthetic": 400, "flagged": 3, "threshold": 0.5,
                      "exact_copies": 1, "fraction_closer_to_train": 0.61,
                      "median_ratio": 0.93}],
    "notes": ["classifier hyperparameters fixed in advance"],
}


runner = CliRunner()


def _submitted(api: FakeApi) -> list[dict[str, Any]]:
    return [json.loads(r.content) for r in api.requests
            if r.method == "POST" and r.url.path == "/v1/jobs"]


def _accept_jobs(api: FakeApi, job_id: str = "job_new") -> None:
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(
        201, json={"job_id": job_id, "type": json.loads(r.content)["type"], "state": "queued"}))


def test_the_sample_report_is_a_valid_document() -> None:
    EvaluationReport.model_validate(REPORT)  # the CLI reads the shared contract's shape


def test_report_rows_put_each_figure_beside_its_reference() -> None:
    rows = {metric: (value, compare) for metric, value, compare in report_rows(REPORT)}
    cnn = rows["TSTR accuracy cnn (train synthetic, test real)"]
    assert cnn == ("0.7120", "trained on real 0.8840, chance 0.1000")
    assert rows["TSTR accuracy logreg (train synthetic, test real)"][0] == "0.6550"
    fd = rows[FD_NAME]
    assert fd[0] == "12.346" and "floor (real train vs held-out) 1.234" in fd[1]
    assert "not FID" in FD_NAME
    assert [rows[k][0] for k in ("precision", "recall", "density", "coverage")] == \
        ["0.6100", "0.4200", "0.7700", "0.5500"]
    assert rows["memorisation: flagged synthetic images"][0] == "3 of 400"
    assert "CHECK" in rows["memorisation: flagged synthetic images"][1]
    assert rows["memorisation: fraction closer to train"][0] == "0.6100"
    acc = rows["feature network accuracy (public validation)"]
    assert acc[0] == "0.9050" and "threshold 0.5000, passed" in acc[1]
    assert rows["feature network sha256"][0] == SHA[:16] + "…"
    assert f"feature network weights sha256: {SHA}" in report_footer(REPORT)
    assert "Inception FID (pinned pytorch-fid weights)" not in rows  # not computed
    assert NON_DP_LINE in report_header(REPORT)


def test_a_public_reference_has_no_non_dp_line_and_missing_metrics_are_skipped() -> None:
    public = {**REPORT, "reference_visibility": "public", "non_dp": False,
              "contains_private_images": False, "feature_network": None, "memorisation": [],
              "headline": {"tstr_accuracy": {"cnn": 0.5}, "real_accuracy": {"cnn": 0.9},
                           "inception_fid": 33.3}}
    EvaluationReport.model_validate(public)
    assert not any(line.startswith("NON-DP") for line in report_header(public))
    metrics = [m for m, _, _ in report_rows(public)]
    assert metrics == ["TSTR accuracy cnn (train synthetic, test real)",
                       "Inception FID (pinned pytorch-fid weights)"]


def test_a_held_out_caveat_is_the_first_line() -> None:
    caveat = "model mdl_up was uploaded: what it was trained on is unknown"
    report = {**REPORT, "holdout_caveat": caveat}
    EvaluationReport.model_validate(report)
    assert report_header(report)[0] == f"HELD-OUT NOT VERIFIED: {caveat}"
    assert not report_header(REPORT)[0].startswith("HELD-OUT")


def test_report_prints_the_table_and_saves_both_files(api: FakeApi, tmp_path: Path) -> None:
    api.route("GET", "/v1/jobs/job_ev/report", lambda r: httpx.Response(
        200, content=b"<html>report</html>", headers={"content-type": "text/html"})
        if r.url.params.get("format") == "html" else httpx.Response(200, json=REPORT))
    html, doc = tmp_path / "r.html", tmp_path / "out" / "r.json"
    result = runner.invoke(app, ["report", "job_ev", "--html", str(html), "--json", str(doc)],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "NON-DP, OWNER ONLY" in out
    for text in ("0.7120", "0.8840", "0.1000", "12.346", "1.234", "0.6100", "0.4200",
                 "0.7700", "0.5500", "3 of 400", "0.9050", SHA, "fd_dpsynth"):
        assert text in out, text
    assert html.read_bytes() == b"<html>report</html>"
    assert json.loads(doc.read_text()) == REPORT
    formats = [r.url.params.get("format") for r in api.requests]
    assert formats == [None, "html", "json"]


def test_report_without_the_owner_scope_exits_2(api: FakeApi) -> None:
    api.route("GET", "/v1/jobs/job_ev/report", lambda r: problem(
        403, "forbidden", "this report is owner-only"))
    result = runner.invoke(app, ["report", "job_ev"])
    assert result.exit_code == 2
    assert "forbidden" in result.output and "owner-only" in result.output


def test_client_download_report_refuses_other_formats(tmp_path: Path) -> None:
    with Client("http://api.test", "k", transport=FakeApi().transport()) as client, \
            pytest.raises(ValueError, match="format"):
        client.download_report("job_ev", tmp_path / "x", format="pdf")


def test_features_train_submits_a_valid_feature_net_spec(api: FakeApi) -> None:
    _accept_jobs(api, "job_feat")
    result = runner.invoke(app, ["features", "train", "ds_public", "--image-size", "16",
                                 "--channels", "1", "--epochs", "3", "--seed", "7"])
    assert result.exit_code == 0, result.output
    (spec,) = _submitted(api)
    assert spec == {"type": "feature_net", "dataset_id": "ds_public", "image_size": 16,
                    "channels": 1, "epochs": 3, "seed": 7}
    FeatureNetSpec.model_validate(spec)
    assert result.stdout == "job job_feat submitted: feature_net, queued\n"
    result = runner.invoke(app, ["features", "train", "ds_public"])
    assert _submitted(api)[-1] == {"type": "feature_net", "dataset_id": "ds_public"}
    result = runner.invoke(app, ["features", "train", "ds_public", "--channels", "2"])
    assert result.exit_code == 2 and len(_submitted(api)) == 2


def test_features_train_wait_follows_the_job(api: FakeApi) -> None:
    _accept_jobs(api, "job_feat")
    states = iter([{"job_id": "job_feat", "type": "feature_net", "state": "running",
                    "progress": {"step": 1, "total": 2}},
                   {"job_id": "job_feat", "type": "feature_net", "state": "succeeded",
                    "progress": {"step": 2, "total": 2}, "result": {"model_id": "mdl_feat"}}])
    api.route("GET", "/v1/jobs/job_feat", lambda r: httpx.Response(200, json=next(states)))
    result = runner.invoke(app, ["features", "train", "ds_public", "--wait", "--poll", "0"])
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output and "mdl_feat" in result.output


def test_evaluate_submits_the_spec_waits_and_prints_the_headline(api: FakeApi) -> None:
    _accept_jobs(api, "job_ev")
    states = iter([{"job_id": "job_ev", "type": "evaluate", "state": "running",
                    "progress": {"step": 1, "total": 5}},
                   {"job_id": "job_ev", "type": "evaluate", "state": "succeeded",
                    "progress": {"step": 5, "total": 5},
                    "result": {"report_artifact_id": "art_r", "non_dp": True}}])
    api.route("GET", "/v1/jobs/job_ev", lambda r: httpx.Response(200, json=next(states)))
    api.route("GET", "/v1/jobs/job_ev/report", REPORT)
    result = runner.invoke(app, [
        "evaluate", "art_corpus", "--dataset", "ds_priv", "--feature-model", "mdl_feat",
        "--classifiers", "cnn, mlp", "--inception", "--no-private-images", "--wait",
        "--poll", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (spec,) = _submitted(api)
    assert spec == {"type": "evaluate", "corpus_artifact_id": "art_corpus",
                    "dataset_id": "ds_priv", "feature_model_id": "mdl_feat",
                    "classifiers": ["cnn", "mlp"], "inception": True,
                    "include_private_images": False}
    EvaluateSpec.model_validate(spec)
    assert "NON-DP, OWNER ONLY" in result.output and "0.7120" in result.output


def test_evaluate_with_dp_epsilon_asks_for_a_dp_release_and_prints_it(api: FakeApi) -> None:
    _accept_jobs(api, "job_ev")
    released = {"label": "DP", "epsilon": 0.5, "metrics": {"tstr_accuracy/cnn": 0.61}}
    api.route("GET", "/v1/jobs/job_ev", {"job_id": "job_ev", "type": "evaluate",
                                         "state": "succeeded",
                                         "result": {"dp_evaluation": released}})
    api.route("GET", "/v1/jobs/job_ev/report", REPORT)
    result = runner.invoke(app, ["evaluate", "art_corpus", "--dataset", "ds_priv",
                                 "--dp-epsilon", "0.5", "--wait", "--poll", "0"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (spec,) = _submitted(api)
    assert spec["dp"] == {"target_epsilon": 0.5}
    EvaluateSpec.model_validate(spec)
    assert "DP evaluation (inside the guarantee)" in result.output
    assert "tstr_accuracy/cnn" in result.output


def test_evaluate_defaults_and_a_failed_job(api: FakeApi) -> None:
    _accept_jobs(api, "job_ev")
    api.route("GET", "/v1/jobs/job_ev", {"job_id": "job_ev", "type": "evaluate",
                                         "state": "failed",
                                         "error": {"code": "no_holdout"}})
    result = runner.invoke(app, ["evaluate", "art_corpus", "--dataset", "ds_x", "--wait",
                                 "--poll", "0"])
    assert result.exit_code == 1
    assert _submitted(api) == [{"type": "evaluate", "corpus_artifact_id": "art_corpus",
                                "dataset_id": "ds_x"}]
    assert not any(r.url.path.endswith("/report") for r in api.requests)
    result = runner.invoke(app, ["evaluate", "art_corpus", "--dataset", "ds_x",
                                 "--classifiers", "cnn,svm"])
    assert result.exit_code == 2 and len(_submitted(api)) == 1


def test_the_owner_lists_the_held_out_records(api: FakeApi) -> None:
    items = [{"index": 3, "record_hash": "ab" * 32}, {"index": 7, "record_hash": "cd" * 32}]
    api.route("GET", "/v1/datasets/ds_1/holdout",
              lambda request: httpx.Response(200, json={"items": items}))
    result = runner.invoke(app, ["datasets", "holdout", "ds_1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"items": items}
    result = runner.invoke(app, ["datasets", "holdout", "ds_1"], env={"COLUMNS": "200"})
    assert "2 held-out records" in result.stdout and "cd" * 32 in result.stdout
    api.route("GET", "/v1/datasets/ds_2/holdout", lambda request: problem(
        403, "forbidden", "this key lacks the owner scope"))
    result = runner.invoke(app, ["datasets", "holdout", "ds_2"])
    assert result.exit_code != 0 and "owner" in result.output


def test_upload_sends_the_holdout_split(api: FakeApi, tmp_path: Path) -> None:
    captured: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        captured["body"] = request.content
        return httpx.Response(201, json={"dataset_id": "ds_2"})

    api.route("POST", "/v1/datasets", handler)
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    base = ["datasets", "upload", str(data), "--name", "n", "--visibility", "private",
            "--epsilon-limit", "4", "--declared-size", "20"]
    result = runner.invoke(app, [*base, "--holdout-fraction", "0.2", "--holdout-key",
                                 "owner-key-0123456789"])
    assert result.exit_code == 0, result.output
    assert b'"holdout_fraction": 0.2' in captured["body"]
    assert b'"holdout_key": "owner-key-0123456789"' in captured["body"]
    assert b"holdout_seed" not in captured["body"]
    result = runner.invoke(app, [*base, "--holdout-fraction", "0.2"],
                           env={"DPSYNTH_HOLDOUT_KEY": "from-the-environment-0123"})
    assert result.exit_code == 0 and b'"holdout_key": "from-the-environment-0123"' in \
        captured["body"]
    result = runner.invoke(app, base)
    assert result.exit_code == 0 and b"holdout" not in captured["body"]
    sent = len(api.requests)
    for bad in (["--holdout-fraction", "1.5"], ["--holdout-key", "owner-key-0123456789"],
                ["--holdout-fraction", "0.2", "--holdout-seed", "3"]):
        result = runner.invoke(app, [*base, *bad])
        assert result.exit_code == 2, bad
    assert len(api.requests) == sent
