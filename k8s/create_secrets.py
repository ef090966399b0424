"""Create the Secrets the kustomize base refers to, from the .env that gen_secrets.py writes.

    python scripts/gen_secrets.py --output .env.k8s         # once: every secret generated
    REDIS_PASSWORD=... python k8s/create_secrets.py --env .env.k8s | kubectl apply -f -

Prints one JSON ``v1/List`` of Secrets (``stringData``, namespace ``dpsynth``) on stdout and
nothing else, so the values go straight to the API server and never into a file of this
repository. REDIS_PASSWORD is the password of the Redis the cluster uses (the Bitnami chart
generates one); it is taken from the environment, never from the env file, whose
REDIS_PASSWORD is docker-compose's Redis password.

The Secret names and keys here are the ones k8s/base references (k8s/README.md, "Secrets");
tests/deploy/test_k8s.py loads each service's settings from the rendered manifests plus this
script's output, so a renamed key fails there, not at a pod's start.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "dpsynth"


def _gen_secrets() -> ModuleType:
    """scripts/gen_secrets.py, for its .env parser (the one docker-compose's file is read with)."""
    path = REPO / "scripts" / "gen_secrets.py"
    spec = importlib.util.spec_from_file_location("gen_secrets", path)
    if spec is None or spec.loader is None:
        raise SystemExit("scripts/gen_secrets.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def secret_data(env: dict[str, str], redis_password: str) -> dict[str, dict[str, str]]:
    """``{secret name: {key: value}}`` for every Secret the base references."""
    def need(name: str) -> str:
        value = env.get(name, "")
        if not value:
            raise SystemExit(f"{name} is empty in the env file; run scripts/gen_secrets.py")
        return value

    if not redis_password:
        raise SystemExit("REDIS_PASSWORD is not set (the password of the cluster's Redis)")
    broker_url = f"redis://:{quote(redis_password, safe='')}@redis:6379/0"
    return {
        "dpsynth-postgres": {
            "api-database-url": need("DPSYNTH_API_DATABASE__URL"),
            "ledger-database-url": need("DPSYNTH_LEDGER_DATABASE__URL"),
        },
        "dpsynth-redis": {"password": redis_password, "broker-url": broker_url},
        "dpsynth-s3": {
            "access-key": need("MINIO_APP_ACCESS_KEY"),
            "secret-key": need("MINIO_APP_SECRET_KEY"),
            # The ledger's anchor credentials: write-only on the anchor bucket, no delete.
            "anchor-access-key": need("MINIO_ANCHOR_ACCESS_KEY"),
            "anchor-secret-key": need("MINIO_ANCHOR_SECRET_KEY"),
        },
        "dpsynth-api-secrets": {
            "ledger-token": need("DPSYNTH_API_LEDGER__TOKEN"),
            "worker-token": need("DPSYNTH_API_WORKER_TOKEN"),
            "record-hash-key": need("DPSYNTH_API_RECORD_HASH_KEY"),
            "grant-public-key": need("DPSYNTH_API_GRANT_PUBLIC_KEY"),
        },
        "dpsynth-ledger-secrets": {
            "service-tokens": need("DPSYNTH_LEDGER_SERVICE_TOKENS"),
            "admin-tokens": need("DPSYNTH_LEDGER_ADMIN_TOKENS"),
            "grant-signing-key": need("DPSYNTH_LEDGER_GRANT_SIGNING_KEY"),
            "chain-signing-key": need("DPSYNTH_LEDGER_CHAIN_SIGNING_KEY"),
        },
        # Only the metrics tokens: the one Secret the ServiceMonitors (Prometheus) read.
        "dpsynth-metrics": {
            "api-token": need("DPSYNTH_API_METRICS_TOKEN"),
            "ledger-token": need("DPSYNTH_LEDGER_METRICS_TOKEN"),
        },
        "dpsynth-worker-secrets": {
            "api-token": need("DPSYNTH_WORKER_API__TOKEN"),
            "ledger-token": need("DPSYNTH_WORKER_LEDGER__TOKEN"),
            "grant-public-key": need("DPSYNTH_WORKER_GRANT_PUBLIC_KEY"),
        },
    }


def secret_list(data: dict[str, dict[str, str]]) -> dict[str, object]:
    """The Secrets as one ``v1/List`` that ``kubectl apply -f -`` takes."""
    items = [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": name, "namespace": NAMESPACE,
                           "labels": {"app.kubernetes.io/part-of": "dpsynth"}},
              "stringData": values} for name, values in data.items()]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", type=Path, default=REPO / ".env",
                        help="the env file scripts/gen_secrets.py wrote (default: .env)")
    args = parser.parse_args(argv)
    env = _gen_secrets().parse_env(args.env.read_text())
    data = secret_data(env, os.environ.get("REDIS_PASSWORD", ""))
    json.dump(secret_list(data), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
