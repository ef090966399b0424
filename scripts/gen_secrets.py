"""Write ``.env`` for docker-compose from ``.env.example`` with every secret generated.

    python scripts/gen_secrets.py            # .env.example -> .env (mode 0600)
    python scripts/gen_secrets.py --force    # replace an existing .env (new secrets!)

Fills each secret that ``.env.example`` leaves empty: bearer tokens and keys (random, 256
bits), database, Redis, MinIO and Grafana passwords, the ledger's two Ed25519 signing keys
(``dpsynth_shared.grants.generate_signing_key``) and the grant public key the api and the
workers verify with (derived from the grant signing key). Then it replaces every ``${NAME}``
in a value with NAME's value, so a database URL carries the password its role was created
with and the ledger's token list holds the tokens the api and workers present. It prints the
names it generated, never the values. Secrets that are already set are kept.

Only the standard library and ``dpsynth_shared.grants`` (which needs ``cryptography``).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Runnable with any Python that has `cryptography`, not only the project's venv.
sys.path.insert(0, str(REPO / "shared" / "src"))

from dpsynth_shared.grants import generate_signing_key, public_key_of  # noqa: E402

# Every secret of .env.example and how it is made. "password" values end up inside URLs,
# so they stay URL-safe; token_urlsafe(32) is 256 bits either way.
SECRETS: dict[str, str] = {
    "POSTGRES_PASSWORD": "password",
    "POSTGRES_API_PASSWORD": "password",
    "POSTGRES_LEDGER_PASSWORD": "password",
    "REDIS_PASSWORD": "password",
    "MINIO_ROOT_PASSWORD": "password",
    "MINIO_APP_SECRET_KEY": "password",
    "MINIO_ANCHOR_SECRET_KEY": "password",
    "GF_SECURITY_ADMIN_PASSWORD": "password",
    "DPSYNTH_API_LEDGER__TOKEN": "token",
    "DPSYNTH_WORKER_LEDGER__TOKEN": "token",
    "DPSYNTH_API_WORKER_TOKEN": "token",
    "DPSYNTH_API_RECORD_HASH_KEY": "token",
    "DPSYNTH_API_METRICS_TOKEN": "token",
    "DPSYNTH_LEDGER_METRICS_TOKEN": "token",
    "DPSYNTH_LEDGER_GRANT_SIGNING_KEY": "ed25519",
    "DPSYNTH_LEDGER_CHAIN_SIGNING_KEY": "ed25519",
}
# Public keys derived from a private key of the same file: name -> private key's name.
PUBLIC_KEYS: dict[str, str] = {
    "DPSYNTH_API_GRANT_PUBLIC_KEY": "DPSYNTH_LEDGER_GRANT_SIGNING_KEY",
    "DPSYNTH_WORKER_GRANT_PUBLIC_KEY": "DPSYNTH_LEDGER_GRANT_SIGNING_KEY",
}

_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")


def unquote(raw: str) -> tuple[str, str]:
    """``(value, quote)``: a value wrapped in one pair of ' or " loses them (dotenv rules)."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1], raw[0]
    return raw, ""


def parse_env(text: str) -> dict[str, str]:
    """The assignments of a .env file (comments and blank lines skipped, quotes removed)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _ASSIGNMENT.match(line.strip())
        if match:
            values[match["name"]] = unquote(match["value"])[0]
    return values


def _generate(kind: str) -> str:
    if kind == "ed25519":
        return generate_signing_key()
    return secrets.token_urlsafe(32)


def _expand(value: str, values: dict[str, str], name: str) -> str:
    def one(match: re.Match[str]) -> str:
        ref = match["name"]
        if ref not in values:
            raise SystemExit(f"{name} refers to ${{{ref}}}, which the file does not set")
        if _REFERENCE.search(values[ref]):
            raise SystemExit(f"{name} refers to {ref}, which itself holds a reference")
        return values[ref]

    return _REFERENCE.sub(one, value)


def render(example: str) -> tuple[str, list[str]]:
    """``.env``'s text from ``.env.example``'s, and the names of the generated secrets."""
    values = parse_env(example)
    missing = sorted((set(SECRETS) | set(PUBLIC_KEYS)) - set(values))
    if missing:
        raise SystemExit(f"the example file lacks {', '.join(missing)}")
    generated: list[str] = []
    for name, kind in SECRETS.items():
        if not values[name]:
            values[name] = _generate(kind)
            generated.append(name)
    for name, private in PUBLIC_KEYS.items():
        if not values[name]:
            values[name] = public_key_of(values[private])
            generated.append(name)
    out: list[str] = []
    for line in example.splitlines():
        match = _ASSIGNMENT.match(line.strip())
        if not match:
            out.append(line)
            continue
        name = match["name"]
        _, quote = unquote(match["value"])
        value = _expand(values[name], values, name)
        out.append(f"{name}={quote}{value}{quote}")
    return "\n".join(out) + "\n", generated


def write_private(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` readable by its owner only (created 0600, never widened)."""
    if path.exists() and not force:
        raise SystemExit(f"{path} exists; use --force to replace it (its secrets are lost)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)  # in case the umask was stricter than needed, or looser
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=REPO / ".env.example",
                        help="the template (default: .env.example at the repository root)")
    parser.add_argument("--output", type=Path, default=REPO / ".env",
                        help="the file to write (default: .env at the repository root)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output file")
    args = parser.parse_args(argv)
    if args.output.exists() and not args.force:
        print(f"{args.output} exists; use --force to replace it (its secrets are lost)",
              file=sys.stderr)
        return 1
    text, generated = render(args.example.read_text())
    write_private(args.output, text, force=args.force)
    print(f"wrote {args.output} (mode 0600); generated {len(generated)} secrets:")
    for name in generated:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
