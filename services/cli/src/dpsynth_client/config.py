"""Where the client and the CLI find the platform, its api and its key (issue 15, items 6, 11).

Each of the URL and the key is resolved on its own, first match wins: explicit arguments
(the CLI's ``--api-url``/``--api-key``), then ``DPSYNTH_API_URL``/``DPSYNTH_API_KEY``, then
the ``credentials.json`` that ``dpsynth up`` writes into the platform's home.

The platform's home, first match wins:

1. ``home`` (the CLI's ``--home``), then ``DPSYNTH_HOME``;
2. the nearest ``.dpsynth`` folder holding a platform (``credentials.json``,
   ``platform.json`` or ``secrets.json``) in the current folder or one of its parents, as git
   finds ``.git``: any sub-folder of a project works like its top;
3. the platform last started with ``dpsynth up``, named by the per-user file
   ``$XDG_STATE_HOME/dpsynth/last-platform.json`` (default ``~/.local/state/dpsynth/``),
   while that folder still holds a platform: any other folder works too;
4. ``./.dpsynth``: where a first ``dpsynth up`` creates the platform.

So a second ``dpsynth up`` from an unrelated folder starts the platform the user already
has instead of a second, empty one; ``--home ./.dpsynth`` starts a new one here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dpsynth_client.errors import NotConfigured

HOME_DIR_NAME = ".dpsynth"
DEFAULT_HOME = Path(HOME_DIR_NAME)
CREDENTIALS_FILE = "credentials.json"
LAST_PLATFORM_FILE = "last-platform.json"
#: Files only a platform's home holds: ``dpsynth up`` writes secrets.json first, then
#: platform.json, then credentials.json once the api answered.
HOME_MARKERS = (CREDENTIALS_FILE, "platform.json", "secrets.json")


@dataclass(frozen=True)
class ClientConfig:
    """The resolved api URL and key, where each came from, and the home looked at."""

    api_url: str
    api_key: str
    url_source: str
    key_source: str
    home: Path | None = None


@dataclass(frozen=True)
class PlatformHome:
    """A platform's home folder, how it was chosen, and the places looked at before it.

    ``origin`` says why in words ("--home", "DPSYNTH_HOME", "the nearest .dpsynth above
    /x/y", "the last `dpsynth up` (~/.local/state/dpsynth/last-platform.json)", "default").
    """

    path: Path
    origin: str
    searched: tuple[str, ...] = field(default=())

    @property
    def credentials_file(self) -> Path:
        return self.path / CREDENTIALS_FILE


def user_state_dir(env: Mapping[str, str]) -> Path:
    """The per-user state folder: ``$XDG_STATE_HOME/dpsynth``, else ``~/.local/state/dpsynth``."""
    base = env.get("XDG_STATE_HOME")
    if base and Path(base).is_absolute():  # the XDG spec ignores relative values
        return Path(base) / "dpsynth"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".local" / "state" / "dpsynth"


def is_platform_home(path: Path) -> bool:
    """Whether ``path`` holds a platform (one of :data:`HOME_MARKERS`)."""
    try:
        return any((path / marker).is_file() for marker in HOME_MARKERS)
    except OSError:
        return False


def find_platform_home(start: Path) -> Path | None:
    """The nearest ``.dpsynth`` holding a platform in ``start`` or one of its parents."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / HOME_DIR_NAME
        if is_platform_home(candidate):
            return candidate
    return None


def last_platform_home(env: Mapping[str, str]) -> Path | None:
    """The home :func:`remember_platform` recorded last, while it still holds a platform."""
    try:
        data = json.loads((user_state_dir(env) / LAST_PLATFORM_FILE).read_text())
    except (OSError, ValueError):
        return None
    home = data.get("home") if isinstance(data, dict) else None
    if not isinstance(home, str) or not home:
        return None
    return Path(home) if is_platform_home(Path(home)) else None


def remember_platform(home: Path | str, env: Mapping[str, str]) -> Path:
    """Record ``home`` as the user's last started platform (what ``dpsynth up`` calls once
    the platform is ready); returns the per-user file. Written whole, then renamed."""
    folder = user_state_dir(env)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / LAST_PLATFORM_FILE
    tmp = target.with_name(f".{LAST_PLATFORM_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"home": str(Path(home).resolve()),
                               "started_at": datetime.now(UTC).isoformat()}, indent=2))
    os.replace(tmp, target)
    return target


def locate_home(home: Path | str | None, env: Mapping[str, str], *,
                cwd: Path | None = None) -> PlatformHome:
    """The platform's home by the rules of this module's docstring (never fails)."""
    if home:
        return PlatformHome(Path(home), "--home")
    if env.get("DPSYNTH_HOME"):
        return PlatformHome(Path(env["DPSYNTH_HOME"]), "DPSYNTH_HOME")
    here = (cwd or Path.cwd()).resolve()
    searched: tuple[str, ...] = (f"{here / HOME_DIR_NAME} and the same in every parent folder",)
    nearest = find_platform_home(here)
    if nearest is not None:
        return PlatformHome(nearest, f"the nearest {HOME_DIR_NAME} above {here}", searched)
    pointer = user_state_dir(env) / LAST_PLATFORM_FILE
    searched += (str(pointer),)
    last = last_platform_home(env)
    if last is not None:
        return PlatformHome(last, f"the last `dpsynth up` ({pointer})", searched)
    return PlatformHome(DEFAULT_HOME, "default", searched)


def resolve_home(home: Path | str | None, env: Mapping[str, str], *,
                 cwd: Path | None = None) -> Path:
    """The platform's home folder (see :func:`locate_home`): ``--home``, ``DPSYNTH_HOME``,
    the nearest ``.dpsynth`` above, the last started platform, else ``./.dpsynth``."""
    return locate_home(home, env, cwd=cwd).path


def read_credentials(home: Path) -> dict[str, str]:
    """The embedded credentials file's contents, or ``{}`` if it is missing or unreadable."""
    try:
        data = json.loads((home / CREDENTIALS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def resolve_config(*, api_url: str | None = None, api_key: str | None = None,
                   env: Mapping[str, str] | None = None, home: Path | str | None = None,
                   cwd: Path | None = None) -> ClientConfig:
    """Resolve the api URL and key (arguments > environment > the home's credentials file).

    Args:
        api_url, api_key: explicit values (the CLI's options); each wins on its own.
        env: the environment (default ``os.environ``).
        home: the platform's home (the CLI's ``--home``); default: looked up.
        cwd: the folder the lookup starts from (default: the current one).

    Raises:
        NotConfigured: when no source gives a URL or a key; its message says where it
            looked, whether a platform runs from another folder, and what to do.
    """
    env = os.environ if env is None else env
    found = locate_home(home, env, cwd=cwd)
    creds = read_credentials(found.path)
    creds_source = str(found.credentials_file)
    url, url_source = _first(("--api-url", api_url),
                             ("DPSYNTH_API_URL", env.get("DPSYNTH_API_URL")),
                             (creds_source, creds.get("api_url")))
    key, key_source = _first(("--api-key", api_key),
                             ("DPSYNTH_API_KEY", env.get("DPSYNTH_API_KEY")),
                             (creds_source, creds.get("api_key")))
    if not url or not key:
        raise _not_configured("api URL" if not url else "API key", found, env, cwd)
    return ClientConfig(api_url=url.rstrip("/"), api_key=key, url_source=url_source,
                        key_source=key_source, home=found.path)


def platform_is_running(home: Path) -> bool:
    """Whether a process that ``home/platform.json`` records is alive (best effort)."""
    try:
        state = json.loads((home / "platform.json").read_text())
        pids = [int(p["pid"]) for p in state.get("processes", [])]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:  # alive, another user's
            return True
        return True
    return False


def _not_configured(missing: str, found: PlatformHome, env: Mapping[str, str],
                    cwd: Path | None) -> NotConfigured:
    option, variable = (("--api-url", "DPSYNTH_API_URL") if missing == "api URL"
                        else ("--api-key", "DPSYNTH_API_KEY"))
    here = (cwd or Path.cwd()).resolve()
    pointer = user_state_dir(env) / LAST_PLATFORM_FILE
    if found.origin == "default":
        where = (f"no platform found (no {HOME_DIR_NAME} in {here} or its parents, none "
                 f"recorded by `dpsynth up` in {pointer})")
    else:
        where = f"{found.credentials_file} ({found.origin}) " + (
            "lacks it" if found.credentials_file.is_file() else "does not exist")
    elsewhere = _platform_elsewhere(found.path, env, here)
    if elsewhere is not None:
        state = "is running" if platform_is_running(elsewhere) else "was started"
        todo = (f"a platform {state} from {elsewhere}: run from there (or a folder below it) "
                f"or pass --home {elsewhere}")
    elif is_platform_home(found.path):
        todo = (f"the platform in {found.path} has not finished starting: run `dpsynth up "
                f"--home {found.path}` (logs in {found.path / 'logs'})")
    else:
        up = f"dpsynth up --home {found.path}" if found.origin == "--home" else "dpsynth up"
        todo = (f"start a platform with `{up}` (it creates {here / found.path}), or pass "
                "--api-url/--api-key or set DPSYNTH_API_URL/DPSYNTH_API_KEY")
    searched = (option, variable, str(found.credentials_file), *found.searched)
    return NotConfigured(f"no {missing}: not in {option} or {variable}, and {where}; {todo}",
                         searched=searched)


def _platform_elsewhere(home: Path, env: Mapping[str, str], here: Path) -> Path | None:
    """A platform with credentials other than ``home``: the nearest above, else the last
    started one (what the message points the user at instead of a second ``dpsynth up``)."""
    for other in (find_platform_home(here), last_platform_home(env)):
        if other is not None and (other / CREDENTIALS_FILE).is_file() \
                and other.resolve() != home.resolve():
            return other
    return None


def _first(*candidates: tuple[str, str | None]) -> tuple[str, str]:
    for source, value in candidates:
        if value:
            return value, source
    return "", ""
