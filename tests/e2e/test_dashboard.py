"""The budget dashboard in a real headless Chromium against the whole platform.

A tenant with two private datasets (one trained by two tiny finetunes; one whose class sizes
are released by a charged DP histogram and then trained per label) and a public one. The
page is driven through Selenium with Debian's ``chromium`` and ``chromedriver`` (no download:
Selenium Manager is never asked for a driver). Every number the page shows is compared with
the api's JSON (the raw value in ``data-value`` exactly, the text to its 4 decimals), the
chart has one point per charged job plus one per other charge, the key lives only in the
tab's sessionStorage, and a key in the URL is refused. Screenshots go to
``build/test-artifacts/``.

Without the browser the test FAILS (CI installs it in ``.ci/run``); set
``DPSYNTH_SKIP_BROWSER=1`` to skip it explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpsynth_client import Client
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.conftest import CLASSES, finetune_spec
from tests.support.browser import ARTIFACTS, chromium
from tests.support.models import tiny_model_archive

KEY_NAME = "dpsynth.dashboard.apiKey"
BUDGET_FIELDS = ("epsilon_limit", "dataset_epsilon_spent", "dataset_tight_epsilon",
                 "dataset_epsilon_reserved", "dataset_epsilon_remaining")
CHARGE_KINDS = ("lease_granted", "histogram_released", "central_images_released")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with chromium(tmp_path_factory.mktemp("chromium-profile"), what="dashboard's") as driver:
        yield driver


@pytest.fixture(scope="module")
def tenant(platform, client: Client, tmp_path_factory) -> dict[str, Any]:
    """The tenant's key and datasets; every charge made, one job left queued (reserved)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    created = client.create_tenant("dashboard", scopes=["read", "submit", "owner"])
    token = created["key"]["api_key"]
    me = Client(platform.api_url, token)
    base = me.upload_model(tiny_model_archive(tmp / "model.tar", class_names=CLASSES),
                           name="tiny-base")["model_id"]

    whole_npz, labels_npz, public_npz, gone_npz = _disjoint_digits(tmp, (96, 60, 40, 20))
    whole = me.upload_dataset(whole_npz, name="whole <b>two jobs</b>", visibility="private",
                              epsilon_limit=1.8, label_domain=CLASSES,
                              declared_size=96)["dataset_id"]
    labels = me.upload_dataset(labels_npz, name="per-label", visibility="private",
                               epsilon_limit=10.0, label_domain=CLASSES,
                               declared_size=60)["dataset_id"]
    public = me.upload_dataset(public_npz, name="public digits",
                               visibility="public")["dataset_id"]
    gone = me.upload_dataset(gone_npz, name="deleted", visibility="private",
                             epsilon_limit=5.0, label_domain=CLASSES,
                             declared_size=20)["dataset_id"]
    me.release_class_sizes(gone, epsilon=0.5)
    assert me.delete_dataset(gone)["deleted_at"] is not None  # the data goes, the ledger stays

    jobs = [me.submit_job(finetune_spec(whole, base, target_epsilon=1.0, epochs=0.5))]
    me.release_class_sizes(labels, epsilon=1.0)  # a non-job charge on every partition
    jobs.append(me.submit_job({
        "type": "finetune", "dataset_id": labels, "base_model_id": base,
        "privacy": {"target_epsilon": 2.0, "max_grad_norm": 1.0},
        "training": {"per_label": True, "trainable": "attention", "expected_batch_size": 4,
                     "epochs": 0.5, "learning_rate": 3e-4, "max_physical_batch_size": 8,
                     "checkpoint_every": 2}}))
    jobs.append(me.submit_job(finetune_spec(whole, base, target_epsilon=1.0, epochs=0.5)))
    for job in jobs:
        done = me.wait_for_job(job["job_id"], timeout=600, poll=1.0)
        assert done["state"] == "succeeded", (done, platform.all_logs()[-4000:])
    # a privacy audit of the first finetune on the public digits (issue 19): it charges
    # nothing, and the finetunes of its recipe family show it
    audit = me.submit_job({"type": "audit", "job_id": jobs[0]["job_id"],
                           "stand_in_dataset_id": public, "canaries": 100})
    audit = me.wait_for_job(audit["job_id"], timeout=600, poll=1.0)
    assert audit["state"] == "succeeded", (audit, platform.all_logs()[-4000:])
    # no worker from here on: the next job stays queued, its admission reserved
    platform.kill("worker-0")
    queued = me.submit_job(finetune_spec(whole, base, target_epsilon=0.1, epochs=0.5))
    assert queued["state"] == "queued", queued
    return {"token": token, "client": me, "whole": whole, "labels": labels, "public": public,
            "gone": gone, "queued": queued["job_id"], "audit": audit}


# ---- helpers -----------------------------------------------------------------------------

def _disjoint_digits(tmp: Path, sizes: tuple[int, ...]) -> list[Path]:
    """npz files of sklearn's digits with no image in two of them (uploads that shared
    records would be refused as overlapping, or linked to one budget)."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(d.images * 16, 0, 255).astype(np.uint8)[..., None]
    seen: set[bytes] = set()
    unique = []
    for i in np.random.default_rng(11).permutation(len(d.target)):
        if images[i].tobytes() not in seen:
            seen.add(images[i].tobytes())
            unique.append(int(i))
    paths, start = [], 0
    for k, n in enumerate(sizes):
        idx = unique[start:start + n]
        start += n
        path = tmp / f"digits-{k}.npz"
        np.savez(path, images=images[idx], labels=d.target[idx].astype(np.int64))
        paths.append(path)
    return paths


def _wait(driver: Any, view: str, timeout: float = 60) -> None:
    def loaded(d: Any) -> bool:
        # Both attributes in ONE read: read one by one, a poll could see the old view's
        # "ready" and the new view's name and act on rows the new render then replaces.
        shown, state = d.execute_script(
            "return [document.body.dataset.view, document.body.dataset.ready];")
        if state == "error":
            raise AssertionError(d.find_element("id", "status").text)
        return bool(shown == view and state == "true")

    WebDriverWait(driver, timeout).until(loaded)


def _fmt_ok(text: str, value: float) -> bool:
    """The shown text is the value to 4 decimals (or 4 significant digits below 1e-3); a
    count (steps, class size) is shown whole."""
    shown = float(text)
    if "." not in text and "e" not in text:
        return float(value).is_integer() and shown == value
    if value == 0 or abs(value) >= 1e-3:
        return len(text.split(".")[-1]) == 4 and abs(shown - value) <= 0.5e-4 + 1e-12
    return math.isclose(shown, value, rel_tol=1e-3)


def _check_number(cell: Any, expected: float | int | None, where: str) -> int:
    """Check one shown number; 1 when it shows a value (0 for a dash)."""
    text = cell.text.strip()
    if expected is None:
        assert cell.get_attribute("data-value") is None and text == "—", where
        return 0
    raw = cell.get_attribute("data-value")
    assert raw is not None, f"{where}: no data-value"
    assert float(raw) == float(expected), f"{where}: {raw} != {expected}"
    assert _fmt_ok(text, float(expected)), f"{where}: shown {text!r} for {expected}"
    return 1


def _numbers(scope: Any) -> list[Any]:
    return scope.find_elements("css selector", "[data-value]")


def _expected_points(budget: dict[str, Any]) -> list[tuple[str | None, str, float]]:
    """One point per job (its last charge) and one per other charge, in ledger order."""
    points: list[tuple[str | None, str, float]] = []
    index: dict[str, int] = {}
    for e in sorted(budget["history"], key=lambda e: e["seq"]):
        if (e["kind"] not in CHARGE_KINDS and not e["rdp_delta"] > 0) or \
                e["dataset_epsilon_spent_after"] is None:
            continue
        point = (e["job_id"], e["kind"], e["dataset_epsilon_spent_after"])
        if e["job_id"] and e["job_id"] in index:
            points[index[e["job_id"]]] = point
            continue
        if e["job_id"]:
            index[e["job_id"]] = len(points)
        points.append(point)
    return points


def _jobs_of(client: Client, dataset_id: str) -> list[dict[str, Any]]:
    return [j for j in client.list_jobs(page_size=200) if j["dataset_id"] == dataset_id]


def _screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    print(f"dashboard screenshot: {path}")
    return path


def _enter_key(driver: Any, key: str) -> None:
    field = driver.find_element("id", "api-key")
    field.clear()
    field.send_keys(key)
    driver.find_element("id", "key-submit").click()


# ---- the tests ---------------------------------------------------------------------------

def test_the_page_and_its_files_carry_a_strict_csp(platform) -> None:
    from dpsynth_api.dashboard.router import STATIC_FILES

    assert {"dashboard.js", "dashboard.css"} <= set(STATIC_FILES)
    for path in ("/dashboard", *(f"/dashboard/static/{name}" for name in STATIC_FILES)):
        r = httpx.get(platform.api_url + path, timeout=10)
        assert r.status_code == 200, (path, r.text)
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp, csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = httpx.get(platform.api_url + "/dashboard", timeout=10).text
    assert "<script>" not in page and "http://" not in page.replace(
        "http://www.w3.org", "") and "https://" not in page  # no inline script, no CDN
    r = httpx.get(platform.api_url + "/dashboard/static/..%2Fapp.py", timeout=10)
    assert r.status_code == 404


@pytest.mark.parametrize("query", ["api_key=x", "token=abc", "key=dps_x_y", "q=dps_abc_def"])
def test_a_key_in_the_url_is_refused(platform, query: str) -> None:
    for path in ("/dashboard", "/dashboard/static/dashboard.js"):
        r = httpx.get(f"{platform.api_url}{path}?{query}", timeout=10)
        assert r.status_code == 400, (path, query, r.text)
        assert r.json()["code"] == "api_key_in_query_string"


def test_the_dashboard_shows_the_apis_numbers(platform, tenant, browser) -> None:
    driver, me, token = browser, tenant["client"], tenant["token"]
    base = platform.api_url + "/dashboard"

    # a key in the URL: the browser gets the api's refusal, not the page
    driver.get(base + "?api_key=" + token)
    assert "api_key_in_query_string" in driver.page_source
    assert not driver.find_elements("id", "key-form")

    driver.get(base)
    _wait(driver, "key")
    assert driver.find_element("id", "api-key").get_attribute("type") == "password"
    key_input = driver.find_element("id", "api-key")
    assert not driver.execute_script("return arguments[0].hasAttribute('name')", key_input)

    # a wrong key: the api answers 401 and the page goes back to the key form
    _enter_key(driver, "dps_nope_0000")
    WebDriverWait(driver, 60).until(
        lambda d: "401" in d.find_element("id", "key-error").text)
    _wait(driver, "key")
    assert driver.execute_script(f"return sessionStorage.getItem('{KEY_NAME}')") is None

    _enter_key(driver, token)
    _wait(driver, "overview")
    # the key: in this tab's sessionStorage only
    assert driver.execute_script(f"return sessionStorage.getItem('{KEY_NAME}')") == token
    assert driver.execute_script("return localStorage.length") == 0
    assert driver.get_cookies() == []
    assert token not in driver.current_url
    assert driver.execute_script("return document.cookie") == ""
    assert driver.find_element("id", "api-key").get_attribute("value") == ""

    # the overview: every dataset, every number against the api
    datasets = me.list_datasets()
    rows = driver.find_elements("css selector", "#datasets-table tr.dataset-row")
    assert len(rows) == len(datasets) == 4
    shown = 0
    for dataset in datasets:
        row = driver.find_element(
            "css selector", f"tr.dataset-row[data-dataset-id='{dataset['dataset_id']}']")
        assert dataset["name"] in row.text  # text, never markup
        badges = row.find_elements("css selector", ".deleted-badge")
        if dataset["deleted_at"]:
            assert dataset["dataset_id"] == tenant["gone"]
            assert [b.get_attribute("data-deleted-at") for b in badges] == [dataset["deleted_at"]]
            assert "deleted" in row.get_attribute("class")
        else:
            assert not badges
        if dataset["visibility"] == "public":
            assert "public, no budget" in row.text and not _numbers(row)
            continue
        budget = me.get_budget(dataset["dataset_id"])
        cells = _numbers(row)
        assert [c.get_attribute("data-field") for c in cells] == list(BUDGET_FIELDS)
        for cell in cells:
            field = cell.get_attribute("data-field")
            shown += _check_number(cell, budget[field], f"{dataset['name']}: {field}")
        state = row.find_element("css selector", ".warning-state")
        assert state.get_attribute("data-warning") == str(budget["warning"]).lower()
        if dataset["deleted_at"]:  # its budget and ledger stay, but it is not "ok"
            assert state.get_attribute("data-state") == "deleted", state.text
            continue
        assert ("warning" in state.text) == budget["warning"]
    assert shown == 3 * len(BUDGET_FIELDS)
    whole = me.get_budget(tenant["whole"])
    assert whole["dataset_epsilon_spent"] > 0 and whole["dataset_epsilon_reserved"] > 0
    labels = me.get_budget(tenant["labels"])
    assert labels["dataset_epsilon_spent"] > 0
    assert labels["dataset_tight_epsilon"] <= labels["dataset_epsilon_spent"]
    _screenshot(driver, "dashboard.png")
    driver.set_window_size(1400, 2200)  # the detail views, whole

    # the detail of the dataset with two finished jobs and a queued one
    driver.find_element("css selector",
                        f"tr[data-dataset-id='{tenant['whole']}'] a.dataset-link").click()
    _wait(driver, "detail")
    # the whole dataset's finetunes share one recipe family: the audit shows on every one
    shown = [me.get_job(j["job_id"])["audit"] for j in _jobs_of(me, tenant["whole"])]
    assert shown and all(a["status"] == "audited" for a in shown)
    assert {a["audit_job_id"] for a in shown} == {tenant["audit"]["job_id"]}
    _check_detail(driver, me, tenant["whole"], expect_partitions=False)
    _screenshot(driver, "dashboard-detail.png")

    # the per-label dataset: a histogram point, a job point, the partitions
    driver.find_element("id", "back-link").click()
    _wait(driver, "overview")
    driver.find_element("css selector",
                        f"tr[data-dataset-id='{tenant['labels']}'] a.dataset-link").click()
    _wait(driver, "detail")
    _check_detail(driver, me, tenant["labels"], expect_partitions=True)
    _screenshot(driver, "dashboard-per-label.png")
    assert token not in driver.current_url

    # forget the key: gone from storage, back to the form; a reload stays there
    driver.find_element("id", "forget-key").click()
    _wait(driver, "key")
    assert driver.execute_script(f"return sessionStorage.getItem('{KEY_NAME}')") is None
    driver.get(base)
    _wait(driver, "key")


def _check_detail(driver: Any, me: Client, dataset_id: str, *, expect_partitions: bool) -> None:
    budget = me.get_budget(dataset_id)
    jobs = _jobs_of(me, dataset_id)
    checked = 0

    summary = driver.find_element("id", "detail-summary")
    for cell in _numbers(summary):
        field = cell.get_attribute("data-field")
        checked += _check_number(cell, budget[field], f"summary {field}")
    assert checked == len(BUDGET_FIELDS) + 1  # and the warning fraction
    assert budget["dataset_tight_epsilon_label"] in summary.text

    # the chart: one point per charged job, one per other charge, and the two lines
    expected = _expected_points(budget)
    charged_jobs = {e["job_id"] for e in budget["history"]
                    if e["kind"] == "lease_granted" and e["job_id"]}
    others = [e for e in budget["history"] if e["kind"] == "histogram_released"]
    assert len(expected) == len(charged_jobs) + len(others)
    points = driver.find_elements("css selector", "#epsilon-chart circle.point")
    assert len(points) == len(expected)
    for point, (job_id, kind, value) in zip(points, expected, strict=True):
        assert point.get_attribute("data-kind") == kind
        assert point.get_attribute("data-job-id") == job_id
        assert float(point.get_attribute("data-value")) == value
    limit = driver.find_element("css selector", "#epsilon-chart .limit-line")
    assert float(limit.get_attribute("data-value")) == budget["epsilon_limit"]
    warn = driver.find_element("css selector", "#epsilon-chart .warning-line")
    assert float(warn.get_attribute("data-value")) == \
        budget["warning_fraction"] * budget["epsilon_limit"]
    rows = driver.find_elements("css selector", "#points-table tr.point-row")
    assert len(rows) == len(expected)
    for row, (job_id, _, value) in zip(rows, expected, strict=True):
        assert row.get_attribute("data-job-id") == job_id
        checked += _check_number(row.find_element("css selector", "[data-value]"), value,
                                 "point row")

    # per-partition figures
    section = driver.find_element("id", "partitions-section")
    if expect_partitions:
        assert section.is_displayed()
        rdp, eps = budget["partitions"], budget["partition_epsilon_spent"]
        assert set(rdp) == {"*", *CLASSES}
        rows = driver.find_elements("css selector", "#partitions-table tr.partition-row")
        assert {r.get_attribute("data-partition") for r in rows} == set(rdp) | set(eps)
        for row in rows:
            name = row.get_attribute("data-partition")
            want = {"class_size": (budget["class_sizes"] or {}).get(name),
                    "partitions": rdp.get(name), "partition_epsilon_spent": eps.get(name)}
            cells = row.find_elements("css selector", "td.num")
            assert [c.get_attribute("data-field") for c in cells] == list(want)
            for cell in cells:
                field = cell.get_attribute("data-field")
                checked += _check_number(cell, want[field], f"partition {name} {field}")
        if eps:  # the filter figure is the largest partition's
            assert max(eps.values()) == pytest.approx(budget["dataset_epsilon_spent"],
                                                      rel=1e-9)
    else:
        assert not section.is_displayed()

    # the jobs on the dataset, with their figures
    rows = driver.find_elements("css selector", "#jobs-table tr.job-row")
    assert {r.get_attribute("data-job-id") for r in rows} == {j["job_id"] for j in jobs}
    after = {job_id: value for job_id, _, value in expected if job_id}
    for job in jobs:
        row = driver.find_element("css selector", f"tr.job-row[data-job-id='{job['job_id']}']")
        assert row.get_attribute("data-state") == job["state"]
        privacy, result = job["privacy"] or {}, job["result"] or {}
        want = {
            "target_epsilon": job["spec"]["privacy"]["target_epsilon"],
            "job_epsilon": privacy.get("job_epsilon"),
            "steps": privacy.get("steps"),
            "job_epsilon_granted": result["job_epsilon_granted"]
            if isinstance(result.get("job_epsilon_granted"), float | int)
            else job["progress"]["epsilon_so_far"],
            "steps_done": result["steps_done"] if isinstance(result.get("steps_done"), int)
            else job["progress"]["step"],
            "model_job_epsilon": result.get("job_epsilon"),
            "dataset_epsilon_spent_after": after.get(job["job_id"]),
        }
        cells = row.find_elements("css selector", "td.num")
        assert [c.get_attribute("data-field") for c in cells] == list(want)
        for cell in cells:
            field = cell.get_attribute("data-field")
            checked += _check_number(cell, want[field], f"job {job['job_id']} {field}")
        if job["state"] == "succeeded":
            assert job["job_id"] in after  # every finished job charged: it is on the chart
        # a finetune shows the latest audit of its recipe family, or "not audited" (as GET
        # /v1/jobs/{id} does); other kinds show nothing
        cell = row.find_element("css selector", "td.job-audit")
        shown = me.get_job(job["job_id"]).get("audit")
        if shown is None:
            assert cell.text == ""
        elif shown["status"] == "not_audited":
            assert cell.get_attribute("data-audit") == "not_audited"
            assert cell.text == "not audited"
        else:
            assert cell.get_attribute("data-audit") == shown["verdict"]
            assert cell.get_attribute("data-audit-job-id") == shown["audit_job_id"]
            assert cell.text.startswith(shown["verdict"] + ": ε ≥ ")
    # every number on the detail view was checked
    assert checked == len(_numbers(driver.find_element("id", "detail-view"))) - \
        len(driver.find_elements("css selector", "#epsilon-chart [data-value]"))
