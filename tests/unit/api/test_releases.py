"""Corpus releases (artifacts/releases.py): the manifest's non_dp_evaluations replaced,
every other entry copied byte for byte with its name, date and compression."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from dpsynth_api.artifacts.releases import computed, release_key, rewrite_manifest
from dpsynth_shared.evaluation import SELECTION_CAVEAT


def _corpus(path: Path, *, manifest: bool = True) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo("a/", date_time=(2020, 1, 2, 3, 4, 6)), b"")
        stored = zipfile.ZipInfo("a/0.png", date_time=(2020, 1, 2, 3, 4, 6))
        zf.writestr(stored, b"\x89PNG" + bytes(range(256)) * 50)
        deflated = zipfile.ZipInfo("a/notes.txt", date_time=(2021, 5, 6, 7, 8, 10))
        deflated.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(deflated, "x" * 10_000)
        if manifest:
            zf.writestr("manifest.json", json.dumps({"model_id": "m", "job_epsilon": 1.5,
                                                     "non_dp_evaluations": []}))


def test_the_manifest_lists_the_evaluations_and_the_rest_is_copied(tmp_path: Path) -> None:
    source, dest = tmp_path / "c.zip", tmp_path / "r.zip"
    _corpus(source)
    listed = [{"job_id": "job_1", "computed": ["tstr_accuracy"]}]
    rewrite_manifest(source, dest, listed)
    with zipfile.ZipFile(source) as before, zipfile.ZipFile(dest) as after:
        assert before.namelist() == after.namelist()
        manifest = json.loads(after.read("manifest.json"))
        assert manifest == {"model_id": "m", "job_epsilon": 1.5, "non_dp_evaluations": listed,
                            "dp_evaluations": [], "selection_caveat": SELECTION_CAVEAT}
        for name in ("a/", "a/0.png", "a/notes.txt"):
            old, new = before.getinfo(name), after.getinfo(name)
            assert before.read(name) == after.read(name)
            assert (old.date_time, old.compress_type) == (new.date_time, new.compress_type)


def test_a_corpus_without_a_manifest_gets_one(tmp_path: Path) -> None:
    source, dest = tmp_path / "c.zip", tmp_path / "r.zip"
    _corpus(source, manifest=False)
    rewrite_manifest(source, dest, [{"job_id": "job_2"}])
    with zipfile.ZipFile(dest) as zf:
        assert json.loads(zf.read("manifest.json")) == {
            "non_dp_evaluations": [{"job_id": "job_2"}], "dp_evaluations": [],
            "selection_caveat": SELECTION_CAVEAT}


def test_what_an_evaluation_computed_follows_its_spec() -> None:
    assert "fd_dpsynth" not in computed({"classifiers": ["cnn"]})
    assert {"fd_dpsynth", "precision", "inception_fid"} <= set(
        computed({"feature_model_id": "mdl_x", "inception": True}))


def test_the_manifest_states_the_selection_caveat_and_lists_dp_evaluations(
        tmp_path: Path) -> None:
    """Issue 13, item 6: a release says plainly that selection by non-DP evaluations is not
    covered by the released epsilon, and lists the DP evaluations as inside the guarantee."""
    source, dest = tmp_path / "c.zip", tmp_path / "r.zip"
    _corpus(source)
    dp = [{"job_id": "job_3", "released": {"tstr_accuracy/cnn": {"accuracy": 0.8}},
           "epsilon": 1.0, "inside_guarantee": True}]
    rewrite_manifest(source, dest, [{"job_id": "job_1"}], dp)
    with zipfile.ZipFile(dest) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["dp_evaluations"] == dp
    caveat = manifest["selection_caveat"]
    assert "does not cover that choice" in caveat and "DP evaluations" in caveat
    assert "non_dp_evaluations" in caveat


class _Artifact:
    object_key = "corpora/job_g/corpus.zip"
    job_id = "job_g"


def test_a_release_key_changes_with_the_dp_list_and_never_reuses_old_releases() -> None:
    art = _Artifact()
    assert release_key(art, [], []) == art.object_key  # type: ignore[arg-type]
    a = release_key(art, [{"job_id": "job_1"}])  # type: ignore[arg-type]
    b = release_key(art, [{"job_id": "job_1"}], [{"job_id": "job_3"}])  # type: ignore[arg-type]
    c = release_key(art, [], [{"job_id": "job_3"}])  # type: ignore[arg-type]
    assert len({a, b, c}) == 3 and all(k.startswith("corpora/job_g/release-") for k in (a, b, c))
