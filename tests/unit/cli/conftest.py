"""The CLI tests' fake api (tests/unit/cli/fake_api.py), answering with the api's real field
names; a test module that needs routes for every test overrides ``api``."""

from __future__ import annotations

import pytest

from tests.unit.cli.fake_api import FakeApi, use_fake_api


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    return use_fake_api(monkeypatch)
