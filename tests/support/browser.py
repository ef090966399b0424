"""Debian's Chromium through its chromedriver (selenium), for the browser tests: the budget
dashboard and the offline API docs. Nothing is downloaded at test time: ``.ci/run`` installs
``chromium`` and ``chromium-driver``; ``DPSYNTH_SKIP_BROWSER=1`` skips these tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
"""Where the browser tests save their screenshots (kept by CI, git-ignored)."""
# Nothing but loopback: names do not resolve, and anything else goes to a dead proxy.
OFFLINE_FLAGS = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                 "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1")


def browser_paths(what: str) -> tuple[str, str]:
    """Chromium's and chromedriver's paths; skips under DPSYNTH_SKIP_BROWSER=1 and fails,
    saying how to install them, when they are missing."""
    if os.environ.get("DPSYNTH_SKIP_BROWSER") == "1":
        pytest.skip(f"DPSYNTH_SKIP_BROWSER=1: the {what} browser test is skipped")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: install Debian's chromium and "
                    "chromium-driver (.ci/run does), or set DPSYNTH_SKIP_BROWSER=1 to skip")
    return CHROMIUM, CHROMEDRIVER


@contextmanager
def chromium(profile: Path, *, what: str, extra_args: Sequence[str] = (),
             logging: dict[str, str] | None = None) -> Iterator[Any]:
    """A headless Chromium driven by selenium, quit at the end of the block.

    Args:
        profile: an empty folder for the browser's profile.
        what: the test's subject, for the skip message.
        extra_args: more command-line flags (e.g. :data:`OFFLINE_FLAGS`).
        logging: ``goog:loggingPrefs`` (e.g. the network log and the console).
    """
    chromium_path, chromedriver = browser_paths(what)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium_path
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-quic", "--no-first-run",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1400,1100", *extra_args, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    if logging:
        options.set_capability("goog:loggingPrefs", logging)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
