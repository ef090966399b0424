"""The dashboard as a privacy officer reads it (issue 15, item 9), in a real headless Chromium.

A tenant with a budget shared by three datasets (an upload, a class subset derived from it,
an upload linked to it with ``on_overlap: link``), a dataset of its own, a deleted one and a
public one; named and unnamed jobs charged to the shared budget, one job left queued. The
page must show the shared figures ONCE (on the owner's row, the api's numbers) with the
members listed under it, the deleted dataset greyed as deleted (never "ok"), the chart's
points named by the job's name (else its id), the key prompt saying where the key is, the
glossary of the epsilons, and the five epsilon columns on screen at 390 px wide.

No training: the platform runs without a Celery worker and the test is the worker, over the
real worker protocol (claim at the api, leases at the ledger, each charged when granted,
then a proposed transition), so a job is charged in milliseconds. Screenshots go to
``build/test-artifacts/dashboard-budgets.png`` and ``dashboard-narrow.png``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_client import Client
from dpsynth_shared.job_states import JobState
from dpsynth_shared.worker_contract import ProposeTransition
from dpsynth_worker.clients import ApiClient, LedgerClient

from tests.e2e.conftest import make_platform
from tests.e2e.test_dashboard import (
    BUDGET_FIELDS,
    _check_number,
    _enter_key,
    _numbers,
    _screenshot,
    _wait,
    browser,  # noqa: F401  (the module's Chromium fixture)
)
from tests.support.platform import ServicePlatform
from tests.unit.api import builders as b

DOMAIN = ["x", "y", "z"]
NAMED = "ward 7 baseline, ε 1 (a long job name)"
SUBSET_JOB = "x-and-y finetune"


@pytest.fixture(scope="module")
def platform(tmp_path_factory, pg, redis_url, s3_endpoint) -> Iterator[ServicePlatform]:
    """The whole platform with NO worker: the test charges jobs itself."""
    p = make_platform(tmp_path_factory.mktemp("platform"), pg, redis_url, s3_endpoint,
                      workers=0)
    yield p
    p.stop()


def _images(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 8, 8, 1), dtype=np.uint8)


def _npz(tmp: Path, name: str, images: np.ndarray) -> Path:
    path = tmp / f"{name}.npz"
    np.savez(path, images=images, labels=np.arange(len(images)) % len(DOMAIN))
    return path


def _spec(dataset_id: str, model_id: str, name: str | None, epsilon: float) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "finetune", "dataset_id": dataset_id, "base_model_id": model_id,
        "privacy": {"target_epsilon": epsilon},
        "training": {"expected_batch_size": 4, "epochs": 1}}
    if name is not None:
        spec["name"] = name
    return spec


def _charge(platform: ServicePlatform, job: dict[str, Any]) -> None:
    """Play the worker for one attempt: claim, take the read grant, lease every planned step
    (charged when granted), close the reservation, and stop the job (no model is made)."""
    api = ApiClient(platform.api_url, platform.worker_token)
    ledger = LedgerClient(platform.ledger_url, platform.worker_ledger_token)
    try:
        claim = api.claim(job["job_id"], attempt=1, worker_id="dashboard-test")
        assert claim.reservation_id is not None
        steps = int(job["privacy"]["steps"])
        ledger.read_grant(claim.reservation_id, attempt=claim.attempt,
                          worker_id="dashboard-test")
        lease = ledger.lease(claim.reservation_id, attempt=claim.attempt, start_step=0,
                             steps=steps)
        ledger.end_lease(claim.reservation_id, lease.lease_id)
        ledger.close_reservation(claim.reservation_id, outcome="failed")
        api.propose_transition(job["job_id"], ProposeTransition(
            attempt=claim.attempt, to_state=JobState.FAILED, error_code="worker_failed",
            message="the dashboard test's stand-in worker charges its steps, trains nothing",
            result={"job_epsilon_granted": lease.job_epsilon_granted, "steps_done": 0}))
    finally:
        api.close()
        ledger.close()


@pytest.fixture(scope="module")
def tenant(platform: ServicePlatform, client: Client, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("dashboard-budgets")
    created = client.create_tenant("officer", scopes=["read", "submit", "owner"])
    token = created["key"]["api_key"]
    reader = client.create_key(created["tenant_id"], ["read"], name="privacy officer")["api_key"]
    me = Client(platform.api_url, token)
    model_zip = tmp / "model.zip"
    model_zip.write_bytes(b.zip_bytes(b.model_folder()))
    model = me.upload_model(model_zip, name="tiny")["model_id"]

    ward = _images(1, 30)
    owner = me.upload_dataset(_npz(tmp, "owner", ward), name="ward 7", visibility="private",
                              epsilon_limit=10.0, label_domain=DOMAIN,
                              declared_size=30)["dataset_id"]
    subset = me.derive_dataset(owner, name="ward 7: x and y", kind="subset",
                               classes=["x", "y"])["dataset_id"]
    linked = me.upload_dataset(_npz(tmp, "linked", np.concatenate([ward[:10], _images(2, 14)])),
                               name="ward 7 re-export", visibility="private",
                               label_domain=DOMAIN, declared_size=24,
                               on_overlap="link")["dataset_id"]
    alone = me.upload_dataset(_npz(tmp, "alone", _images(3, 20)), name="ward 9",
                              visibility="private", epsilon_limit=4.0, label_domain=DOMAIN,
                              declared_size=20)["dataset_id"]
    gone = me.upload_dataset(_npz(tmp, "gone", _images(4, 20)), name="retired ward",
                             visibility="private", epsilon_limit=5.0, label_domain=DOMAIN,
                             declared_size=20)["dataset_id"]
    public = me.upload_dataset(_npz(tmp, "public", _images(5, 12)), name="public phantoms",
                               visibility="public")["dataset_id"]
    me.release_class_sizes(gone, epsilon=0.5)  # a charge the deletion keeps
    assert me.delete_dataset(gone)["deleted_at"] is not None

    jobs = {"named": me.submit_job(_spec(owner, model, NAMED, 1.0)),
            "subset": me.submit_job(_spec(subset, model, SUBSET_JOB, 0.8)),
            "unnamed": me.submit_job(_spec(linked, model, None, 0.5))}
    for job in jobs.values():
        assert job["state"] == "queued", job
        _charge(platform, job)
    queued = me.submit_job(_spec(linked, model, "left queued", 0.3))  # reserved, not spent
    assert queued["state"] == "queued", queued
    for dataset_id in (owner, gone):  # the tight figure is computed in the background
        _settled(me, dataset_id)
    return {"token": token, "reader": reader, "me": me, "owner": owner, "subset": subset,
            "linked": linked, "alone": alone, "gone": gone, "public": public, "jobs": jobs,
            "queued": queued["job_id"]}


def _settled(me: Client, dataset_id: str, timeout: float = 60) -> None:
    """Wait until the budget's tight figure includes every charge (so the page and the
    test read the same numbers)."""
    deadline = time.monotonic() + timeout
    while True:
        view = me.get_budget(dataset_id)
        if view["dataset_tight_epsilon"] is not None and not view["dataset_tight_epsilon_pending"]:
            return
        assert time.monotonic() < deadline, view
        time.sleep(0.5)


def _figures(scope: Any) -> list[Any]:
    """The budget figures of a row or group (a dash has no data-value, but a field)."""
    return scope.find_elements("css selector", "td.num[data-field]")


def _row(driver: Any, dataset_id: str) -> Any:
    return driver.find_element("css selector", f"tr.dataset-row[data-dataset-id='{dataset_id}']")


def _open(driver: Any, platform: ServicePlatform, token: str) -> None:
    """The overview, from a fresh key form (a key left in the tab is forgotten first)."""
    driver.get(platform.api_url + "/dashboard")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    _wait(driver, "key")
    _enter_key(driver, token)
    _wait(driver, "overview")


def test_the_key_prompt_says_where_the_key_is(platform, browser) -> None:  # noqa: F811
    browser.get(platform.api_url + "/dashboard")
    _wait(browser, "key")
    text = browser.find_element("id", "key-view").text
    for words in (".dpsynth/credentials.json", "api_key", "DPSYNTH_API_KEY",
                  "stays in this tab"):
        assert words in text, (words, text)
    glossary = browser.find_element("id", "epsilon-glossary")
    assert "What these epsilons mean" in glossary.text
    glossary.find_element("tag name", "summary").click()
    for term in ("Spent ε (filter)", "Tight ε*", "Reserved ε", "Remaining ε",
                 "docs/epsilons.md"):
        assert term in glossary.text, term


def test_shared_budgets_deleted_datasets_and_named_points(
        platform, tenant, browser) -> None:  # noqa: F811
    driver, me = browser, tenant["me"]
    driver.set_window_size(1400, 1100)
    _open(driver, platform, tenant["token"])
    owner, subset, linked = tenant["owner"], tenant["subset"], tenant["linked"]

    # one group for the shared budget: the owner's row carries the figures, once
    group = driver.find_element("css selector", f"tbody.budget-group[data-budget-id='{owner}']")
    rows = group.find_elements("css selector", "tr.dataset-row")
    assert [r.get_attribute("data-dataset-id") for r in rows] == [owner, subset, linked]
    budget = me.get_budget(owner)
    assert budget["budget_dataset_ids"] == [owner, subset, linked]
    assert budget["dataset_epsilon_spent"] > 0 and budget["dataset_epsilon_reserved"] > 0
    assert len(_numbers(group)) == len(BUDGET_FIELDS)  # the five shared figures, once
    cells = _figures(group)
    assert [c.get_attribute("data-field") for c in cells] == list(BUDGET_FIELDS)
    assert all(c.find_element("xpath", "..") == rows[0] for c in cells)
    for cell in cells:
        field = cell.get_attribute("data-field")
        _check_number(cell, budget[field], f"shared {field}")
    assert "budget shared by 3 datasets" in rows[0].text
    for member, words in ((rows[1], "derived from ward 7"), (rows[2], "linked to ward 7")):
        assert "member-row" in member.get_attribute("class")
        assert words in member.text and "charges the budget of ward 7" in member.text
        assert member.find_element("css selector", ".warning-state").text == "as above"
    assert (me.get_budget(subset)["dataset_epsilon_spent"] == me.get_budget(linked)[
        "dataset_epsilon_spent"] == budget["dataset_epsilon_spent"])

    # a budget of its own: its own group, its own figures
    alone = _row(driver, tenant["alone"])
    assert "budget-row" in alone.get_attribute("class") and alone.get_attribute(
        "data-members") == "0"
    assert alone.find_element("css selector", ".warning-state").text == "ok"

    # the deleted dataset: greyed, "deleted", never "ok"; its charged budget is still shown
    gone = _row(driver, tenant["gone"])
    assert "deleted" in gone.get_attribute("class").split()
    state = gone.find_element("css selector", ".warning-state")
    assert state.get_attribute("data-state") == "deleted" and "ok" not in state.text.split()
    assert "budget and ledger kept" in gone.text
    spent = gone.find_element("css selector", "[data-field='dataset_epsilon_spent']")
    _check_number(spent, me.get_budget(tenant["gone"])["dataset_epsilon_spent"], "deleted")
    assert float(spent.get_attribute("data-value")) > 0
    color = driver.execute_script("return getComputedStyle(arguments[0]).color", state)
    assert color != driver.execute_script(
        "return getComputedStyle(arguments[0]).color",
        alone.find_element("css selector", ".warning-state"))  # not the green of "ok"
    assert "public, no budget" in _row(driver, tenant["public"]).text
    _screenshot(driver, "dashboard-budgets.png")

    # the shared budget's chart: each job's point carries its name, else its id
    driver.set_window_size(1400, 2000)
    driver.find_element("css selector", f"tr[data-dataset-id='{subset}'] a.dataset-link").click()
    _wait(driver, "detail")
    banner = driver.find_element("id", "detail-budget")
    assert banner.is_displayed() and "charges the budget of ward 7" in banner.text
    assert "ward 7 re-export" in banner.text
    jobs = tenant["jobs"]
    want = {jobs["named"]["job_id"]: NAMED, jobs["subset"]["job_id"]: SUBSET_JOB,
            jobs["unnamed"]["job_id"]: jobs["unnamed"]["job_id"]}
    points = driver.find_elements("css selector", "#epsilon-chart circle.job-point")
    assert {p.get_attribute("data-job-id"): p.get_attribute("data-label")
            for p in points} == want
    labels = driver.find_elements("css selector", "#epsilon-chart text.point-label")
    shown = {t.get_attribute("data-job-id"): t.text for t in labels}
    for job_id, label in want.items():
        assert label.startswith(shown[job_id].rstrip("…")), (label, shown[job_id])
        assert len(shown[job_id]) <= 18
    titles = [p.find_element("tag name", "title").get_attribute("textContent") for p in points]
    assert any(t.startswith(NAMED + " (job ") and " on ward 7" in t for t in titles), titles
    rows = driver.find_elements("css selector", "#jobs-table tr.job-row")
    assert [r.get_attribute("data-job-id") for r in rows] == [jobs["subset"]["job_id"]]
    assert SUBSET_JOB in rows[0].text
    _screenshot(driver, "dashboard-budgets-detail.png")

    # a deleted dataset's own page says so, and that its budget and ledger stay
    driver.get(platform.api_url + "/dashboard#/datasets/" + tenant["gone"])
    _wait(driver, "detail")
    note = driver.find_element("id", "detail-deleted")
    assert note.is_displayed() and "budget and its ledger stay" in note.text
    state = driver.find_element("css selector", "#detail-summary .warning-state")
    assert state.get_attribute("data-state") == "deleted", state.text


def test_the_epsilon_columns_stay_on_a_narrow_screen(platform, tenant, browser) -> None:  # noqa: F811
    """On a phone, with a key of the read scope only (what a privacy officer is given)."""
    driver, me = browser, tenant["me"]
    driver.set_window_size(390, 1400)
    _open(driver, platform, tenant["reader"])
    groups = driver.find_elements("css selector", "tbody.budget-group")
    assert [g.get_attribute("data-budget-id") for g in groups] == [
        tenant["alone"], tenant["owner"], tenant["gone"]]  # a deleted budget last
    width = driver.execute_script("return window.innerWidth")
    assert width <= 400, width
    assert driver.execute_script(
        "return document.documentElement.scrollWidth") <= width  # nothing to scroll sideways
    for dataset_id in (tenant["owner"], tenant["alone"], tenant["gone"]):
        budget = me.get_budget(dataset_id)
        cells = _figures(_row(driver, dataset_id))
        assert [c.get_attribute("data-field") for c in cells] == list(BUDGET_FIELDS)
        for cell in cells:
            assert cell.is_displayed()
            left, right = driver.execute_script(
                "const r = arguments[0].getBoundingClientRect(); return [r.left, r.right];",
                cell)
            assert 0 <= left < right <= width, (dataset_id, left, right, width)
            field = cell.get_attribute("data-field")
            _check_number(cell, budget[field], f"narrow {field}")
            label = driver.execute_script(
                "return getComputedStyle(arguments[0], '::before').content", cell)
            assert "ε" in label, label  # the column's name rides with the figure
    _screenshot(driver, "dashboard-narrow.png")
    driver.set_window_size(1400, 1100)
