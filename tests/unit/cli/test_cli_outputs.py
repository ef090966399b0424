"""The CLI's scripting contract and default outputs (issue 15, item 2), against the fake api:
``--quiet`` prints only the created (or, with ``--watch``/``--wait``, the produced) id, the
default is a one-line summary, ``--json`` exactly the api's body; the dry run's first line
says what the job spends; a finished job names what it produced and the next command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpsynth_api.datasets.schemas import DatasetOut
from dpsynth_api.jobs.schemas import DryRun, JobOut
from dpsynth_api.models.schemas import ModelOut
from dpsynth_cli.main import app
from dpsynth_cli.summaries import dry_run_line, dry_run_rows
from typer.testing import CliRunner

from tests.unit.cli.fake_api import FakeApi, dataset_body, job_body, model_body

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    path = tmp_path / "digits.zip"
    path.write_bytes(b"PK")
    return path


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def _follow(api: FakeApi, *states: dict[str, Any]) -> None:
    """GET /v1/jobs/{id} answers ``states`` in turn (the last one from then on)."""
    seen = list(states)
    api.route("GET", f"/v1/jobs/{states[0]['job_id']}",
              lambda r: httpx.Response(200, json=seen.pop(0) if len(seen) > 1 else seen[0]))


def test_the_fake_bodies_are_the_api_schemas() -> None:
    JobOut.model_validate(job_body())
    DatasetOut.model_validate(dataset_body())
    ModelOut.model_validate(model_body())


def test_quiet_prints_only_the_created_id(api: FakeApi, data: Path, tmp_path: Path) -> None:
    api.route("POST", "/v1/datasets", lambda r: httpx.Response(201, json=dataset_body("ds_9")))
    api.route("POST", "/v1/datasets/ds_9/derive",
              lambda r: httpx.Response(201, json=dataset_body("ds_10")))
    api.route("POST", "/v1/models", lambda r: httpx.Response(201, json=model_body("mdl_3")))
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(
        201, json=job_body("job_4", json.loads(r.content)["type"])))
    upload = ["datasets", "upload", str(data), "--name", "d", "--visibility", "private",
              "--epsilon-limit", "8", "--declared-size", "1100", "--quiet"]
    cases = [(upload, "ds_9"),
             (["datasets", "derive", "ds_9", "--name", "t", "--split", "0.8", "-q"], "ds_10"),
             (["models", "upload", str(data), "--name", "m", "-q"], "mdl_3"),
             (["jobs", "submit", str(_spec(tmp_path, "type: pretrain\n")), "-q"], "job_4"),
             (["features", "train", "ds_9", "--quiet"], "job_4"),
             (["evaluate", "art_1", "--dataset", "ds_9", "--quiet"], "job_4")]
    for args, wanted in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert result.stdout == f"{wanted}\n", args


def test_an_upload_prints_one_summary_line_and_json_only_with_json(api: FakeApi,
                                                                   data: Path) -> None:
    body = dataset_body("ds_9")
    api.route("POST", "/v1/datasets", lambda r: httpx.Response(201, json=body))
    args = ["datasets", "upload", str(data), "--name", "d", "--visibility", "private",
            "--epsilon-limit", "8", "--declared-size", "1100", "--holdout-fraction", "0.25"]
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout == ('dataset ds_9 "digits-private" (private): 808 images to train '
                             "on, 10 classes; budget: epsilon limit 8, declared size 1,100, "
                             "held-out fraction 0.25 (270 images)\n")
    result = runner.invoke(app, [*args, "--json"])
    assert json.loads(result.stdout) == body
    assert runner.invoke(app, [*args, "--json", "--quiet"]).exit_code == 2


@pytest.mark.parametrize(("args", "route", "body"), [
    (["jobs", "show", "job_1"], "/v1/jobs/job_1", job_body()),
    (["datasets", "show", "ds_1"], "/v1/datasets/ds_1", dataset_body()),
    (["models", "show", "mdl_1"], "/v1/models/mdl_1", model_body()),
    (["budget", "ds_1"], "/v1/datasets/ds_1/budget",
     {"dataset_id": "ds_1", "epsilon_limit": 8.0, "dataset_epsilon_spent": 5.1}),
])
def test_no_json_without_json_and_exactly_the_body_with_it(api: FakeApi, args: list[str],
                                                           route: str,
                                                           body: dict[str, Any]) -> None:
    api.route("GET", route, body)
    human = runner.invoke(app, args, env=WIDE)
    assert human.exit_code == 0, human.output
    assert not human.stdout.lstrip().startswith(("{", "["))
    with pytest.raises(json.JSONDecodeError):
        json.loads(human.stdout)
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == body


def test_submit_prints_one_line_and_lists_show_the_name(api: FakeApi, tmp_path: Path) -> None:
    job = job_body("job_5", "finetune", name="digits-dp-finetune")
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(201, json=job))
    result = runner.invoke(app, ["jobs", "submit", str(_spec(tmp_path, "type: finetune\n"))])
    assert result.stdout == 'job job_5 submitted: finetune "digits-dp-finetune", queued\n'
    older = job_body("job_6", "generate", name=None, spec={"type": "generate",
                                                          "name": "from-the-spec"})
    api.route("GET", "/v1/jobs", {"items": [job, older], "next_cursor": None})
    listed = runner.invoke(app, ["jobs", "list"], env=WIDE)
    assert listed.exit_code == 0, listed.output
    assert "digits-dp-finetune" in listed.stdout and "from-the-spec" in listed.stdout
    header = next(line for line in listed.stdout.splitlines() if "job_id" in line)
    assert [w for w in header.split() if w.isidentifier()][:2] == ["job_id", "name"]


def test_a_list_on_a_narrow_terminal_shows_every_id_whole(api: FakeApi) -> None:
    job_id = "job_ad361bed4fd04bcbb3c0ffee12345678"
    api.route("GET", "/v1/jobs", {"items": [job_body(job_id, "feature_net", name="a-name")],
                                  "next_cursor": None})
    listed = runner.invoke(app, ["jobs", "list"], env={"COLUMNS": "80"})
    assert listed.exit_code == 0, listed.output
    assert job_id in listed.stdout and "…" not in listed.stdout


def test_generate_watch_ends_with_the_corpus_and_its_download_command(api: FakeApi,
                                                                      tmp_path: Path) -> None:
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(
        201, json=job_body("job_g", "generate", model_id="mdl_dp")))
    done = job_body("job_g", "generate", "succeeded", model_id="mdl_dp",
                    progress={"step": 4, "total": 4}, result={"images": 600},
                    artifacts=[{"artifact_id": "art_manifest", "kind": "manifest",
                                "owner_only": False, "non_dp": False},
                               {"artifact_id": "art_corpus", "kind": "corpus",
                                "owner_only": False, "non_dp": False}])
    _follow(api, job_body("job_g", "generate", "running", progress={"step": 1, "total": 4}),
            done)
    spec = str(_spec(tmp_path, "type: generate\nmodel_id: mdl_dp\n"))
    result = runner.invoke(app, ["jobs", "submit", spec, "--watch", "--poll", "0"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == [
        "corpus: art_corpus", "download it: dpsynth download art_corpus -o corpus.zip"]
    assert "━" not in result.stdout and "job_g" in result.stderr  # the bar is on stderr
    _follow(api, done)
    quiet = runner.invoke(app, ["jobs", "submit", spec, "--watch", "--quiet", "--poll", "0"])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stdout == "art_corpus\n"


def test_watch_quiet_prints_the_produced_model_never_the_base(api: FakeApi,
                                                              tmp_path: Path) -> None:
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(
        201, json=job_body("job_f", "finetune", model_id="mdl_base")))
    _follow(api, job_body("job_f", "finetune", "succeeded", model_id="mdl_base",
                          result={"model_id": "mdl_new"}))
    spec = str(_spec(tmp_path, "type: finetune\n"))
    result = runner.invoke(app, ["jobs", "submit", spec, "--watch", "-q", "--poll", "0"])
    assert result.exit_code == 0 and result.stdout == "mdl_new\n"
    human = runner.invoke(app, ["jobs", "submit", spec, "--watch", "--poll", "0"], env=WIDE)
    assert "produced model: mdl_new (fine-tuned from mdl_base)" in human.stdout
    assert "--set model_id=mdl_new" in human.stdout
    _follow(api, job_body("job_f", "finetune", "failed", model_id="mdl_base",
                          error={"code": "worker_lost", "message": "gone"}))
    failed = runner.invoke(app, ["jobs", "submit", spec, "--watch", "-q", "--poll", "0"])
    assert failed.exit_code == 1 and failed.stdout == ""
    assert "ended failed: worker_lost: gone" in failed.stderr


def test_wait_quiet_prints_the_feature_model_and_the_evaluate_job(api: FakeApi) -> None:
    api.route("POST", "/v1/jobs", lambda r: httpx.Response(201, json=job_body(
        "job_x", json.loads(r.content)["type"])))
    _follow(api, job_body("job_x", "feature_net", "succeeded", result={"model_id": "mdl_f"}))
    result = runner.invoke(app, ["features", "train", "ds_p", "--wait", "-q", "--poll", "0"])
    assert result.exit_code == 0 and result.stdout == "mdl_f\n"
    _follow(api, job_body("job_x", "evaluate", "succeeded"))
    result = runner.invoke(app, ["evaluate", "art_c", "--dataset", "ds_p", "--wait", "-q",
                                 "--poll", "0"])
    assert result.exit_code == 0 and result.stdout == "job_x\n"
    assert not any(r.url.path.endswith("/report") for r in api.requests)


def test_jobs_show_names_the_base_model_apart_from_the_produced_one(api: FakeApi) -> None:
    running = job_body("job_f", "finetune", "running", model_id="mdl_base",
                       progress={"step": 3, "total": 10})
    api.route("GET", "/v1/jobs/job_f", running)
    out = " ".join(runner.invoke(app, ["jobs", "show", "job_f"], env=WIDE).stdout.split())
    assert "base model mdl_base (the model fine-tuned; not this job's result)" in out
    assert "produced model (none yet: shown once the job succeeds)" in out
    api.route("GET", "/v1/jobs/job_f", {**running, "state": "succeeded",
                                        "result": {"model_id": "mdl_new"}})
    out = " ".join(runner.invoke(app, ["jobs", "show", "job_f"], env=WIDE).stdout.split())
    assert "produced model mdl_new" in out and "base model mdl_base" in out


def test_jobs_show_gives_an_audits_verdict_bound_claim_and_ceiling(api: FakeApi) -> None:
    view = {"verdict": "cannot_bite", "epsilon_lower_bound": 0.42, "claimed_epsilon": 10.0,
            "max_certifiable_epsilon": 5.09, "canaries": 1000, "confidence": 0.95,
            "gdp": {"epsilon_lower_bound": 0.61}}
    done = job_body("job_a", "audit", "succeeded", dataset_id="ds_pub", model_id="mdl_base",
                    result={"audit": {"audited_job_id": "job_f"}, "audit_result": view})
    api.route("GET", "/v1/jobs/job_a", done)
    out = " ".join(runner.invoke(app, ["jobs", "show", "job_a"], env=WIDE).stdout.split())
    assert "audited job job_f" in out
    assert "could not have rejected its claim" in out and "measured epsilon >= 0.42" in out
    assert "claimed 10" in out and "at most 5.09 could be certified" in out
    assert "(f-DP: >= 0.61)" in out and "1000 canaries" in out
    finetune = job_body("job_f", "finetune", "succeeded", model_id="mdl_base",
                        audit={"status": "not_audited", "recipe_family": "trainable=full,K=1"})
    api.route("GET", "/v1/jobs/job_f", finetune)
    out = " ".join(runner.invoke(app, ["jobs", "show", "job_f"], env=WIDE).stdout.split())
    assert "privacy audit not audited (trainable=full,K=1)" in out
    api.route("GET", "/v1/jobs/job_f", {**finetune, "audit": {
        "status": "audited", "recipe_family": "trainable=full,K=1", "audit_job_id": "job_a",
        "audited_job_id": "job_f", "same_job": True, "verdict": "consistent",
        "epsilon_lower_bound": 0.3, "claimed_epsilon": 2.0, "engine": "BookKeepingEngine",
        "device": "cpu", "code_version": "0.1.0", "finished_at": "2026-11-27T19:00:00Z"}})
    out = " ".join(runner.invoke(app, ["jobs", "show", "job_f"], env=WIDE).stdout.split())
    assert "privacy audit consistent: measured epsilon >= 0.3 against a claimed 2" in out
    assert "(audit job_a of this job, BookKeepingEngine, cpu, version 0.1.0" in out
    assert dry_run_line({"type": "audit", "plan": {"epsilon_charged": 0.0}}, None).startswith(
        "this job spends no privacy budget: an audit runs")


PLAN = {"job_epsilon": 4.0, "noise_multiplier": 1.1, "sample_rate": 0.116, "steps": 140,
        "expected_batch_size": 128, "delta": 1e-6, "dataset_epsilon_spent_before": 0.0,
        "dataset_epsilon_spent_after": 5.12, "admissible": True,
        "max_admissible_target_epsilon": 6.5, "notes": ["a note"]}


def test_the_dry_run_says_first_what_the_job_spends(api: FakeApi, tmp_path: Path) -> None:
    dry = {"dry_run": True, "type": "finetune", "dataset_id": "ds_1", "model_id": "mdl_b",
           "steps": 140, "plan": PLAN, "spec": {"type": "finetune", "dataset_id": "ds_1"}}
    DryRun.model_validate(dry)
    api.route("POST", "/v1/jobs", dry)
    api.route("GET", "/v1/datasets/ds_1/budget", {"dataset_id": "ds_1", "epsilon_limit": 8.0,
                                                 "dataset_epsilon_spent": 0.0,
                                                 "dataset_epsilon_reserved": 0.0})
    spec = _spec(tmp_path, "type: finetune\ndataset_id: ds_1\n")
    result = runner.invoke(app, ["jobs", "submit", str(spec), "--dry-run"], env=WIDE)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == ("this job spends 5.12 of 8; 2.88 left (the dataset's spent figure, "
                        "RDP filter: 0 → 5.12; the job's own epsilon is 4)")
    assert lines[-1] == "what these epsilons mean: docs/epsilons.md"
    assert any("noise multiplier" in line and "1.1000" in line for line in lines)
    as_json = runner.invoke(app, ["jobs", "submit", str(spec), "--dry-run", "--json"])
    assert json.loads(as_json.stdout) == dry
    api.route("POST", "/v1/jobs", {**dry, "warnings": ["set training.class_map"]})
    warned = runner.invoke(app, ["jobs", "submit", str(spec), "--dry-run"], env=WIDE)
    assert "warning: set training.class_map" in warned.stderr


def test_the_dry_run_names_a_central_image_release_beside_dp_sgd() -> None:
    """A finetune with training.central_images: the plan's figure after composes the release
    with DP-SGD (the ledger's), and the line and the rows say which epsilon is which."""
    plan = {**PLAN, "dataset_epsilon_spent_after": 6.0,
            "central_images": {"epsilon": 2.0, "kind": "gaussian", "rdp_charge": 0.1}}
    line = dry_run_line({"type": "finetune", "plan": plan}, {"epsilon_limit": 8.0})
    assert line == ("this job spends 6 of 8; 2 left (the dataset's spent figure, RDP filter: "
                    "0 → 6; the DP-SGD part's own epsilon is 4, its central-image release's "
                    "2, both counted in the figure after)")
    rows = dict(dry_run_rows({"type": "finetune", "plan": plan}))
    assert rows["central-image release"].startswith("standalone epsilon 2, charged when")
    assert "central-image release" not in dict(dry_run_rows({"type": "finetune",
                                                             "plan": PLAN}))


def test_the_dry_run_line_counts_reservations_refusals_and_free_jobs() -> None:
    budget = {"epsilon_limit": 8.0, "dataset_epsilon_reserved": 1.0}
    held = dry_run_line({"type": "finetune", "plan": {**PLAN, "dataset_epsilon_spent_before":
                                                      2.0, "dataset_epsilon_spent_after": 6.0}},
                        budget)
    assert held.startswith("this job spends 3 of 8; 2 left (")
    assert "2 + 1 reserved by running jobs → 6" in held
    refused = dry_run_line({"type": "finetune", "plan": {
        **PLAN, "dataset_epsilon_spent_before": 6.5, "dataset_epsilon_spent_after": 9.0,
        "admissible": False, "max_admissible_target_epsilon": 0.4}}, budget)
    assert refused.startswith("this job would spend 1.5 of 8, but only 0.5 is left: it "
                              "would be refused (lower target_epsilon to ≤ 0.4)")
    rounded = dry_run_line({"type": "finetune", "plan": {
        **PLAN, "dataset_epsilon_spent_before": 6.5, "dataset_epsilon_spent_after": 9.0,
        "admissible": False, "max_admissible_target_epsilon": 1.7558}}, budget)
    assert "(lower target_epsilon to ≤ 1.75)" in rounded  # down, never up to 1.76
    assert dry_run_line({"type": "generate", "plan": None}, None).startswith(
        "this job spends no privacy budget: sampling")
    assert "public" in dry_run_line({"type": "pretrain", "plan": None}, None)
