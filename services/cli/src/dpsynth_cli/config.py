"""Where the CLI finds the platform, the api and its key: :mod:`dpsynth_client.config`.

The CLI and the Python client (``Client.from_env()``) resolve alike (issue 15, item 11).
Each value is resolved on its own, first match wins: the ``--api-url``/``--api-key``
options, then ``DPSYNTH_API_URL``/``DPSYNTH_API_KEY``, then ``<home>/credentials.json``.
The home: ``--home``, else ``DPSYNTH_HOME``, else the nearest ``.dpsynth`` holding a
platform in the current folder or a parent, else the platform last started with ``dpsynth
up`` (``$XDG_STATE_HOME/dpsynth/last-platform.json``, default ``~/.local/state/dpsynth``),
else ``./.dpsynth`` (where a first ``dpsynth up`` creates it). ``dpsynth up`` records its
home with :func:`remember_platform` once the platform is ready.

This module keeps the names the CLI's modules and the embedded platform import.
"""

from __future__ import annotations

from dpsynth_client.config import (
    CREDENTIALS_FILE,
    DEFAULT_HOME,
    HOME_DIR_NAME,
    LAST_PLATFORM_FILE,
    ClientConfig,
    PlatformHome,
    find_platform_home,
    is_platform_home,
    last_platform_home,
    locate_home,
    platform_is_running,
    read_credentials,
    remember_platform,
    resolve_config,
    resolve_home,
    user_state_dir,
)
from dpsynth_client.errors import NotConfigured

__all__ = ["CREDENTIALS_FILE", "DEFAULT_HOME", "HOME_DIR_NAME", "LAST_PLATFORM_FILE",
           "ClientConfig", "NotConfigured", "PlatformHome", "find_platform_home",
           "is_platform_home", "last_platform_home", "locate_home", "platform_is_running",
           "read_credentials", "remember_platform", "resolve_config", "resolve_home",
           "user_state_dir"]
