"""Where the CLI finds the api and its key.

Each value is resolved on its own, first match wins: the ``--api-url``/``--api-key``
options, then ``DPSYNTH_API_URL``/``DPSYNTH_API_KEY``, then the embedded platform's
credentials file ``<home>/credentials.json`` (home: ``--home``, else ``DPSYNTH_HOME``, else
``./.dpsynth``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dpsynth_shared.errors import DpsynthError, ErrorCode

DEFAULT_HOME = Path(".dpsynth")


@dataclass(frozen=True)
class ClientConfig:
    """The resolved api URL and key, and where each came from (for ``dpsynth status``)."""

    api_url: str
    api_key: str
    url_source: str
    key_source: str


def resolve_home(home: Path | str | None, env: Mapping[str, str]) -> Path:
    """``--home``, else ``DPSYNTH_HOME``, else ``./.dpsynth``."""
    if home:
        return Path(home)
    if env.get("DPSYNTH_HOME"):
        return Path(env["DPSYNTH_HOME"])
    return DEFAULT_HOME


def read_credentials(home: Path) -> dict[str, str]:
    """The embedded credentials file's contents, or ``{}`` if it is missing or unreadable."""
    try:
        data = json.loads((home / "credentials.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def resolve_config(*, api_url: str | None, api_key: str | None, env: Mapping[str, str],
                   home: Path | str | None = None) -> ClientConfig:
    """Resolve the api URL and key (options > env > credentials file).

    Raises:
        DpsynthError: ``unauthenticated`` when no source gives a URL or a key.
    """
    home_dir = resolve_home(home, env)
    creds_path = home_dir / "credentials.json"
    creds = read_credentials(home_dir)
    url, url_source = _first(("--api-url", api_url),
                             ("DPSYNTH_API_URL", env.get("DPSYNTH_API_URL")),
                             (str(creds_path), creds.get("api_url")))
    key, key_source = _first(("--api-key", api_key),
                             ("DPSYNTH_API_KEY", env.get("DPSYNTH_API_KEY")),
                             (str(creds_path), creds.get("api_key")))
    if not url or not key:
        missing = "api URL" if not url else "API key"
        raise DpsynthError(ErrorCode.UNAUTHENTICATED,
                           f"no {missing}: pass --api-url/--api-key, set DPSYNTH_API_URL/"
                           f"DPSYNTH_API_KEY, or run `dpsynth up` (writes {creds_path})")
    return ClientConfig(api_url=url.rstrip("/"), api_key=key, url_source=url_source,
                        key_source=key_source)


def _first(*candidates: tuple[str, str | None]) -> tuple[str, str]:
    for source, value in candidates:
        if value:
            return value, source
    return "", ""
