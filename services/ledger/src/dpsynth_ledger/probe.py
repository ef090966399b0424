"""``python -m dpsynth_ledger.probe``: the readiness check of compose and Kubernetes.

Exits 0 when the ledger's ``/readyz`` answers 200, or 503 ``ledger_behind_anchor``: a ledger
whose database was restored from a backup refuses every write until an operator runs
``dpsynth ledger reconcile-after-restore``, and that goes through the api to THIS ledger, so
taking it out of its Service (or holding the api back in compose) would block the fix. Any
other answer (database down, anchor unreadable or diverged) or no answer exits 1.
Standard library only: it starts in well under a second.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

BEHIND = "ledger_behind_anchor"


def ready(url: str, timeout_s: float = 4.0) -> bool:
    """True when ``url`` (the ledger's /readyz) says ready or behind its anchor."""
    if not url.startswith(("http://", "https://")):
        return False
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            return False
        try:
            return bool(json.loads(exc.read() or b"{}").get("code") == BEHIND)
        except (ValueError, AttributeError):
            return False
    except OSError:
        return False


def main() -> int:
    port = os.environ.get("DPSYNTH_LEDGER_PORT", "8100")
    url = sys.argv[1] if len(sys.argv) > 1 else f"http://127.0.0.1:{port}/readyz"
    return 0 if ready(url) else 1


if __name__ == "__main__":
    raise SystemExit(main())
