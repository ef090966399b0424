"""``/docs`` and ``/redoc`` render in a real headless Chromium with no network beyond the api
(issue 15, item 7): a hospital network without internet.

The api and the ledger run as real processes (no worker: nothing here trains). Chromium can
reach only the api: every host name but 127.0.0.1 resolves to nothing, and every request
that is not to loopback goes to a proxy that does not exist, so a file fetched from a CDN
would fail and the page would stay blank. Swagger UI must render the operations and its
"Authorize" button; the test authorizes with a real API key, runs "Try it out" on the
budget of a private dataset and reads the api's answer in the page. ReDoc must render the
operations too. Every request the browser made is to the api's origin, none failed, and the
console holds no Content-Security-Policy violation. Screenshots go to
``build/test-artifacts/``: ``docs-offline.png`` (authorized, the operations),
``docs-offline-try-it-out.png`` (the api's answer) and ``redoc-offline.png``.

Driven through Selenium with Debian's ``chromium`` and ``chromedriver`` (no download), like
tests/e2e/test_dashboard.py. Without the browser the test FAILS (CI installs it in
``.ci/run``); set ``DPSYNTH_SKIP_BROWSER=1`` to skip it explicitly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from dpsynth_client import Client
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.conftest import CLASSES, digits_npz, make_platform
from tests.support.browser import ARTIFACTS, OFFLINE_FLAGS, chromium
from tests.support.platform import ServicePlatform

BUDGET_PATH = "/v1/datasets/{dataset_id}/budget"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # The network log (every request, every failure) and the console (CSP violations).
    with chromium(tmp_path_factory.mktemp("chromium-profile"), what="docs'",
                  extra_args=OFFLINE_FLAGS,
                  logging={"performance": "ALL", "browser": "ALL"}) as driver:
        yield driver


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, pg: Any,
             redis_url: str) -> Iterator[ServicePlatform]:
    # The api and the ledger only, on the local object store: the docs need no worker.
    p = make_platform(tmp_path_factory.mktemp("docs-platform"), pg, redis_url, None,
                      workers=0)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def tenant(platform: ServicePlatform,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tenant's key and one private dataset with a budget of ε 3."""
    admin = Client(platform.api_url, platform.admin_key())
    token = admin.create_tenant("docs", scopes=["read", "submit", "owner"])["key"]["api_key"]
    npz, _ = digits_npz(tmp_path_factory.mktemp("docs") / "private.npz", part="private", n=40)
    dataset = Client(platform.api_url, token).upload_dataset(
        npz, name="ward-7 scans", visibility="private", epsilon_limit=3.0,
        label_domain=CLASSES, declared_size=40)["dataset_id"]
    return {"token": token, "dataset": dataset}


# ---- helpers -----------------------------------------------------------------------------

def _network(driver: Any) -> tuple[list[str], list[str]]:
    """The URLs the page requested and the URLs that failed, since the last call."""
    requested, failed, urls = [], [], {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
            requested.append(params["request"]["url"])
        elif message["method"] == "Network.loadingFailed" and not params.get("canceled"):
            failed.append(f"{urls.get(params['requestId'])}: {params.get('errorText')}")
    return requested, failed


def _check_offline(driver: Any, api_url: str) -> list[str]:
    """Every request over the network went to the api, none failed, no CSP violation.
    (data:, blob: and the browser's own chrome:// pages never leave the machine.)"""
    requested, failed = _network(driver)
    origin = urlsplit(api_url)
    foreign = [u for u in requested if urlsplit(u).scheme in ("http", "https", "ws", "wss")
               and (urlsplit(u).scheme, urlsplit(u).netloc) != (origin.scheme, origin.netloc)]
    assert foreign == [], f"requests to other origins: {foreign}"
    assert failed == [], f"failed requests: {failed}"
    console = [e["message"] for e in driver.get_log("browser")]
    violations = [m for m in console if "Content Security Policy" in m or "Refused to" in m]
    assert violations == [], violations
    return requested


def _open(driver: Any, url: str) -> None:
    """Load ``url`` with the network log and the console emptied first."""
    driver.get_log("performance")
    driver.get_log("browser")
    driver.get(url)


def _wait_for(driver: Any, css: str, timeout: float = 60) -> Any:
    WebDriverWait(driver, timeout).until(
        lambda d: d.find_elements("css selector", css) or None)
    return driver.find_elements("css selector", css)


def _click(driver: Any, element: Any) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    element.click()


def _authorize(driver: Any, token: str) -> None:
    """Swagger UI's "Authorize": the bearer scheme's dialog, the key, Authorize, Close."""
    _click(driver, _wait_for(driver, ".auth-wrapper .authorize")[0])
    field = _wait_for(driver, ".modal-ux .auth-container input")[0]
    field.send_keys(token)
    _click(driver, driver.find_element("css selector",
                                       ".modal-ux .auth-btn-wrapper .modal-btn.authorize"))
    _wait_for(driver, ".modal-ux .auth-btn-wrapper .btn-done")  # shown once authorized
    assert "Authorized" in driver.find_element("css selector", ".modal-ux").text
    _click(driver, driver.find_element("css selector", ".modal-ux .btn-done"))


def _try_budget(driver: Any, dataset: str) -> tuple[str, str, str]:
    """"Try it out" on GET the budget: the status, the answer and the curl command shown."""
    block = _wait_for(driver, f'.opblock-get [data-path="{BUDGET_PATH}"]')[0]
    _click(driver, block)
    operation = driver.find_element(
        "xpath", f'//div[contains(@class, "opblock-get")][.//*[@data-path="{BUDGET_PATH}"]]')
    _click(driver, _wait_for(driver, ".opblock.is-open .try-out__btn")[0])
    param = operation.find_element("css selector", 'tr[data-param-name="dataset_id"] input')
    param.send_keys(dataset)
    _click(driver, operation.find_element("css selector", ".execute"))
    status = _wait_for(driver,
                       ".opblock.is-open .live-responses-table .response .response-col_status")
    answer = operation.find_element("css selector",
                                    ".live-responses-table .response-col_description pre")
    curl = operation.find_element("css selector", ".curl-command")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});",
                          operation.find_element("css selector", ".responses-inner"))
    return status[0].text.strip(), answer.text, curl.text


def _padlock(path: str) -> str:
    return (f'//div[contains(@class, "opblock ")][.//*[@data-path="{path}"]]'
            '//button[contains(@class, "authorization__btn")]')


# ---- the tests ---------------------------------------------------------------------------

def test_swagger_ui_works_offline(browser: Any, platform: ServicePlatform,
                                  tenant: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _open(browser, f"{platform.api_url}/docs")
    summaries = _wait_for(browser, ".opblock .opblock-summary-path")
    paths = {s.get_attribute("data-path") for s in summaries}
    assert {"/v1/datasets", "/v1/jobs", BUDGET_PATH} <= paths
    assert not any(p.startswith("/internal") for p in paths)
    tags = {t.text.split("\n")[0] for t in browser.find_elements("css selector",
                                                                 ".opblock-tag")}
    assert {"datasets", "budgets", "jobs", "models", "artifacts"} <= tags
    # a key-protected operation shows the padlock; the public probe does not
    assert browser.find_elements("xpath", _padlock(BUDGET_PATH))
    assert browser.find_elements("xpath", _padlock("/healthz")) == []

    _authorize(browser, tenant["token"])
    browser.execute_script("window.scrollTo(0, 0);")
    browser.save_screenshot(str(ARTIFACTS / "docs-offline.png"))  # authorized, the list
    status, answer, curl = _try_budget(browser, tenant["dataset"])
    browser.save_screenshot(str(ARTIFACTS / "docs-offline-try-it-out.png"))
    assert status == "200", answer
    budget = json.loads(answer)
    assert budget["dataset_id"] == tenant["dataset"]
    assert budget["epsilon_limit"] == 3.0
    assert f"Authorization: Bearer {tenant['token']}" in curl
    requested = _check_offline(browser, platform.api_url)
    assert any(u.endswith("/docs/static/swagger-ui-bundle.js") for u in requested)
    assert any(u.endswith(f"/v1/datasets/{tenant['dataset']}/budget") for u in requested)


def test_redoc_works_offline(browser: Any, platform: ServicePlatform) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _open(browser, f"{platform.api_url}/redoc")
    _wait_for(browser, "[data-section-id]")
    WebDriverWait(browser, 60).until(
        lambda d: "privacy_budget_exhausted" in d.find_element("tag name", "body").text
        or None)
    text = browser.find_element("tag name", "body").text
    assert "dpsynth api" in text and "/v1/jobs" in text and "/internal" not in text
    browser.save_screenshot(str(ARTIFACTS / "redoc-offline.png"))
    requested = _check_offline(browser, platform.api_url)
    assert any(u.endswith("/docs/static/redoc.standalone.js") for u in requested)
