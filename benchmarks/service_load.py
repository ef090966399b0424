"""Service load: job submissions/s and ledger admissions/s on the real embedded platform.

Starts ``dpsynth_cli.embedded.EmbeddedPlatform`` (PostgreSQL, Redis, ledger, api) on
loopback with **no worker**, so submitted jobs stay ``queued`` in Redis and the 2 CPU cores
measure the services, not training. The load comes from locust (``benchmarks/locustfile.py``,
headless, one user class per run, closed loop: every user sends its next request as soon as
the previous one is answered).

(a) Submissions under concurrency (8 and 32 users at CPU scale), each row its own run:

- ``GET /healthz``: the baseline of the same run (the cheapest request the api answers);
- ``POST /v1/jobs`` ``pretrain`` on a public dataset: validation, job row, Celery message
  (no ledger);
- ``POST /v1/jobs`` ``finetune`` on one of several private datasets: the same plus the
  ledger's admission (noise calibration, then the filter under the budget row's lock, a
  reservation and a chain entry); the jobs stay queued, their reservations open;
- ``POST /v1/jobs?dry_run=true`` ``finetune``: validation and the ledger's plan only.

(b) Ledger admissions under contention: all users send ``POST /v1/reservations`` straight to
the ledger against ONE dataset's budget until it is exhausted; half of the accepted
reservations go on like a job (read grant, a lease charging half the steps, close), so the
budget ends with committed and reserved RDP. Then zero overspend is checked twice: from the
ledger's view (committed + reserved ≤ the RDP budget at the admission order, and in ε ≤ the
limit) and by replaying the dataset's exported ledger (hash chain and signatures checked
locally) entry by entry, with every charge recomputed here from its recorded mechanism
(Mironov et al. 2019's sampled-Gaussian RDP in mpmath, independent of the ledger's code).

Rates are answers per second over the whole run (all users start at once; requests in
flight when the run ends are still answered); latencies are exact percentiles. The figure
to carry to other machines is the ratio to ``/healthz`` of the same run: absolute rates
depend on the CPU and, here, on whoever else uses the 2 cores.

Run: ``.venv/bin/python -m benchmarks.service_load`` (``BENCH_SCALE=full`` for longer runs
and more users).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import ROOT, bench_main, fmt, percentile

NAME = "service_load"
GPU_RELEVANT = False  # services only: no GPU row in the docs
LOCUSTFILE = ROOT / "benchmarks" / "locustfile.py"
CLASSES = [str(i) for i in range(10)]

SETTINGS: dict[str, dict[str, Any]] = {
    # seconds: how long new requests are sent (the ones in flight then are still answered);
    # the ledger-bound rows answer about one request per second on 2 busy cores, so their
    # runs last a few latencies at 32 users.
    "cpu": {"users": [8, 32], "healthz_s": 8, "pretrain_s": 10, "finetune_s": [15, 30],
            "dry_run_users": [8], "dry_run_s": 15, "private_datasets": 4,
            "ledger_users": 32, "ledger_single_s": 15, "ledger_max_s": 150,
            "ledger_epsilon_limit": 8.0, "ledger_target_epsilon": 1.0},
    "full": {"users": [8, 32, 128], "healthz_s": 30, "pretrain_s": 60,
             "finetune_s": [90, 120, 240], "dry_run_users": [8, 32], "dry_run_s": 90,
             "private_datasets": 8, "ledger_users": 64, "ledger_single_s": 60,
             "ledger_max_s": 600, "ledger_epsilon_limit": 10.0, "ledger_target_epsilon": 0.5},
}
FINETUNE_TARGET_EPSILON = 0.5  # small against a limit of 100: (a) never exhausts a budget
RESERVE_SHAPE = {"expected_batch_size": 50, "steps": 40}
LEDGER_DATASET_SIZE = 500
STOP_TIMEOUT_S = 120.0  # users finish the request in flight when a run ends (no lost answers)


@dataclass
class Platform:
    """What the load runs need to know about the started platform."""

    api_url: str
    ledger_url: str
    api_key: str
    ledger_token: str
    ledger_worker_token: str
    home: Path


@contextmanager
def embedded_platform() -> Iterator[Platform]:
    """The real embedded platform in a fresh temporary home, no worker; removed afterwards."""
    from dpsynth_cli.embedded import EmbeddedPlatform, load_or_create_secrets

    home = Path(tempfile.mkdtemp(prefix="dpsynth-bench-"))
    platform = EmbeddedPlatform(home, workers=0)
    try:
        state = platform.start()
        creds = json.loads(platform.credentials_file.read_text())
        secrets = load_or_create_secrets(home)
        yield Platform(api_url=state.api_url, ledger_url=state.ledger_url,
                       api_key=creds["api_key"], ledger_token=secrets.ledger_token_api,
                       ledger_worker_token=secrets.ledger_token_worker, home=home)
    finally:
        platform.stop()
        # the services' logs outlive the platform (out/ is not committed): a 5xx under load
        # is a finding, and its traceback is only in there
        logs = ROOT / "out" / "bench" / NAME / "logs"
        shutil.rmtree(logs, ignore_errors=True)
        if (home / "logs").is_dir():
            shutil.copytree(home / "logs", logs)
        shutil.rmtree(home, ignore_errors=True)


# --------------------------------------------------------------------------- set-up


def _npz(path: Path, n: int, seed: int, size: int = 16, *, class_names: bool = False) -> Path:
    """Random images (distinct per seed, so private uploads never overlap) with 10 labels;
    the ML core's own format also names the classes."""
    rng = np.random.default_rng(seed)
    extra = {"class_names": np.array(CLASSES)} if class_names else {}
    np.savez(path, images=rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8),
             labels=(np.arange(n) % len(CLASSES)).astype(np.int64), **extra)
    return path


def _tiny_model_archive(work: Path) -> tuple[Path, dict[str, Any]]:
    """A real diffusers folder (the ML core's ``tiny`` preset, one epoch on noise: six steps,
    under a second), tarred; and what the results record about its pretraining. The model
    comes from the pretraining cache (``benchmarks/pretrain_cache.py``) when it was trained
    before (the noise is seeded and ``np.savez`` writes the same bytes for the same arrays);
    its directory is only read here (tarred into ``work``). No job here trains on it."""
    import tarfile

    from dpsynth_ml import PretrainTraining

    from benchmarks.pretrain_cache import cached_pretrain

    spec = PretrainTraining(preset="tiny", image_size=16, channels=1,
                            num_classes=len(CLASSES), epochs=1, batch_size=32, seed=0)
    pretrained = cached_pretrain(
        spec, _npz(work / "noise.npz", 80, seed=1, class_names=True), label=f"{NAME}:tiny",
        scratch_dir=work / "tiny-model")
    archive = work / "model.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(pretrained.model_dir.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(pretrained.model_dir)))
    return archive, pretrained.record()


def prepare(p: Platform, settings: dict[str, Any]) -> dict[str, Any]:
    """Upload a model, a public dataset, the private datasets of (a) and the ledger's (b);
    ``pretrain_cache``: where the uploaded model's pretraining came from."""
    from dpsynth_client import Client

    work = p.home / "bench-inputs"
    work.mkdir()
    client = Client(p.api_url, p.api_key, timeout=300)
    archive, pretrain_cache = _tiny_model_archive(work)
    model_id = client.upload_model(archive, name="bench-tiny")["model_id"]
    public = client.upload_dataset(_npz(work / "public.npz", 200, seed=2), name="bench-public",
                                   visibility="public", label_domain=CLASSES)
    private = [client.upload_dataset(_npz(work / f"private{i}.npz", 200, seed=100 + i),
                                     name=f"bench-private-{i}", visibility="private",
                                     epsilon_limit=100.0, label_domain=CLASSES,
                                     declared_size=200)
               for i in range(settings["private_datasets"])]
    contended = client.upload_dataset(
        _npz(work / "contended.npz", LEDGER_DATASET_SIZE, seed=99), name="bench-contended",
        visibility="private", epsilon_limit=settings["ledger_epsilon_limit"],
        label_domain=CLASSES, declared_size=LEDGER_DATASET_SIZE)
    single = client.upload_dataset(
        _npz(work / "single.npz", LEDGER_DATASET_SIZE, seed=98), name="bench-single-client",
        visibility="private", epsilon_limit=100.0, label_domain=CLASSES,
        declared_size=LEDGER_DATASET_SIZE)
    pretrain = {"type": "pretrain", "dataset_id": public["dataset_id"], "preset": "tiny",
                "image_size": 16, "channels": 1, "class_conditional": True, "epochs": 1,
                "batch_size": 64, "seed": 0}
    finetunes = [{
        "type": "finetune", "dataset_id": d["dataset_id"], "base_model_id": model_id,
        "privacy": {"target_epsilon": FINETUNE_TARGET_EPSILON, "max_grad_norm": 1.0},
        "training": {"trainable": "attention", "expected_batch_size": 32, "epochs": 1.0,
                     "learning_rate": 3e-4, "class_conditional": True,
                     "class_map": {c: c for c in CLASSES}},
    } for d in private]
    client.close()
    return {"pretrain": [pretrain], "finetune": finetunes,
            "contended_dataset_id": contended["dataset_id"],
            "single_dataset_id": single["dataset_id"], "pretrain_cache": pretrain_cache}


# --------------------------------------------------------------------------- locust


def run_locust(p: Platform, user_class: str, *, users: int, seconds: float,
               env: dict[str, str], host: str, out: Path,
               tag: str | None = None) -> list[list[Any]]:
    """One headless locust run of ``user_class``; returns its per-request records.

    Locust's own CSVs (``out/<tag>-<users>_stats.csv``, ...) are kept beside the records
    (``out/<tag>-<users>.json``); ``tag`` defaults to the class name.
    """
    stem = f"{tag or user_class}-{users}"
    raw = out / f"{stem}.json"
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "-u", str(users), "-r", str(users), "-t", f"{int(seconds)}s",
            "--host", host, "--csv", str(out / stem), "--only-summary",
            "--loglevel", "WARNING", "--exit-code-on-error", "0",
            "--stop-timeout", str(int(STOP_TIMEOUT_S)), user_class]
    full_env = {**os.environ, "BENCH_API_KEY": p.api_key, "BENCH_LEDGER_TOKEN": p.ledger_token,
                "BENCH_LEDGER_WORKER_TOKEN": p.ledger_worker_token,
                "BENCH_RAW_OUT": str(raw), **env}
    proc = subprocess.run(argv, env=full_env, capture_output=True, text=True,
                          timeout=seconds + STOP_TIMEOUT_S + 120, check=False)
    if proc.returncode != 0 or not raw.exists():
        raise RuntimeError(f"locust {user_class} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records: list[list[Any]] = json.loads(raw.read_text())
    return records


def summarize_load(records: list[list[Any]], *,
                   ok: tuple[int, ...] = (200, 201)) -> dict[str, Any]:
    """Answers per second over the whole run, exact p50/p99 latency, and the failures.

    The rate is correct answers over [first request sent, last answer received]: the run
    starts all users at once and lets the requests in flight at the end finish, so no answer
    is lost; for a saturated (CPU-bound) service the rate does not depend on how many are in
    flight. A window shorter than the run would quantise badly when one answer takes tens of
    seconds (32 users, about one admission per second).
    """
    if not records:
        return {"requests": 0, "ok": 0, "errors": 0, "rate_per_s": 0.0,
                "p50_ms": None, "p99_ms": None}
    first = min(r[1] for r in records)
    last = max(r[1] + r[2] for r in records)
    good = [r for r in records if r[3] in ok]
    errors = [r for r in records if r[3] not in ok]
    lat = [r[2] * 1000 for r in good]
    return {
        "requests": len(records), "ok": len(good), "errors": len(errors),
        "error_codes": sorted({f"{r[3]} {r[4]}".strip() for r in errors}),
        "elapsed_s": round(last - first, 2),
        "rate_per_s": len(good) / (last - first) if last > first else 0.0,
        "p50_ms": percentile(lat, 50) if lat else None,
        "p99_ms": percentile(lat, 99) if lat else None,
    }


def submissions(p: Platform, inputs: dict[str, Any], settings: dict[str, Any],
                out: Path) -> list[dict[str, Any]]:
    """(a): each scenario at each concurrency; ratios to ``/healthz`` at the same users."""
    rows: list[dict[str, Any]] = []
    for i, users in enumerate(settings["users"]):
        finetune_s = settings["finetune_s"][min(i, len(settings["finetune_s"]) - 1)]
        plan = [("healthz", "HealthzUser", settings["healthz_s"], {}, "healthz"),
                ("submit pretrain (no ledger)", "SubmitUser", settings["pretrain_s"],
                 {"BENCH_SPECS": json.dumps(inputs["pretrain"])}, "submit-pretrain"),
                ("submit finetune (ledger admission)", "SubmitUser", finetune_s,
                 {"BENCH_SPECS": json.dumps(inputs["finetune"])}, "submit-finetune"),
                ("dry-run finetune (ledger plan)", "DryRunUser", settings["dry_run_s"],
                 {"BENCH_SPECS": json.dumps(inputs["finetune"])}, "dry-run-finetune")]
        if users not in settings["dry_run_users"]:
            plan.pop()
        base: float | None = None
        for scenario, cls, seconds, env, tag in plan:
            t0 = time.perf_counter()
            records = run_locust(p, cls, users=users, seconds=seconds, env=env,
                                 host=p.api_url, out=out, tag=tag)
            row = {"scenario": scenario, "users": users, "duration_s": seconds,
                   **summarize_load(records)}
            if scenario == "healthz":
                base = row["rate_per_s"]
            row["ratio_to_healthz"] = row["rate_per_s"] / base if base else None
            rows.append(row)
            print(f"  [{scenario}] users={users} {row['rate_per_s']:.2f}/s "
                  f"p50={fmt(row['p50_ms'])} ms p99={fmt(row['p99_ms'])} ms "
                  f"errors={row['errors']} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return rows


# --------------------------------------------------------------------------- ledger


def sampled_gaussian_rdp(noise_multiplier: float, sample_rate: float, order: int) -> float:
    """RDP at an integer ``order`` of one Poisson-subsampled Gaussian step (add/remove).

    Mironov, Talwar & Zhang 2019, Sec. 3.3: A_α = Σ_k C(α,k)(1−q)^{α−k} q^k e^{(k²−k)/(2σ²)},
    RDP = log(A_α)/(α−1). Evaluated here with mpmath so the replay does not reuse the
    ledger's code; it may differ from the ledger's rounded-up value in the last bits.
    """
    import mpmath

    if sample_rate >= 1.0:
        return order / (2.0 * noise_multiplier**2)
    with mpmath.workdps(50):
        q, two_var = mpmath.mpf(sample_rate), 2 * mpmath.mpf(noise_multiplier) ** 2
        a = mpmath.fsum(mpmath.binomial(order, k) * (1 - q) ** (order - k) * q**k
                        * mpmath.exp((k * k - k) / two_var) for k in range(order + 1))
        return float(mpmath.log(a) / (order - 1))


def replay_export(export: dict[str, Any], *, rel_tol: float = 1e-9) -> dict[str, Any]:
    """Replay a dataset's exported ledger: committed + reserved RDP after every entry.

    Each reservation's hold is recomputed from its recorded mechanism (noise multiplier,
    sample rate, steps) at the dataset's admission order; a lease moves its steps from the
    hold to committed; a close drops the hold. Overspend is any point where committed +
    reserved exceeds the RDP budget recorded at creation by more than ``rel_tol``.
    """
    entries = export["entries"]
    created = next(e["payload"] for e in entries if e["kind"] == "budget_created")
    order, budget = int(created["admission_order"]), float(created["rdp_budget"])
    per_step: dict[str, float] = {}
    held: dict[str, float] = {}
    steps_left: dict[str, int] = {}
    committed, peak, kinds = 0.0, 0.0, {}
    max_recorded_diff = 0.0
    for e in entries:
        kind, pl = e["kind"], e["payload"]
        kinds[kind] = kinds.get(kind, 0) + 1
        rid = pl.get("reservation_id")
        if kind == "reservation_accepted":
            ev = pl["event"]
            per_step[rid] = sampled_gaussian_rdp(ev["noise_multiplier"], ev["sample_rate"],
                                                 order)
            steps_left[rid] = int(pl["steps"])
            held[rid] = per_step[rid] * steps_left[rid]
        elif kind == "lease_granted":
            n = int(pl["steps"])
            committed += per_step[rid] * n
            steps_left[rid] -= n
            held[rid] = per_step[rid] * steps_left[rid]
        elif kind == "reservation_closed":
            held[rid] = 0.0
        elif kind not in ("budget_created", "reservation_refused", "read_grant"):
            raise ValueError(f"the replay does not know ledger entries of kind {kind!r}")
        total = committed + sum(held.values())
        peak = max(peak, total)
        recorded = (pl.get("figures") or {}).get("rdp_committed_plus_reserved")
        if recorded is not None:
            max_recorded_diff = max(max_recorded_diff, abs(recorded - total) / max(total, 1e-300))
    return {"entries": len(entries), "kinds": kinds, "admission_order": order,
            "rdp_budget": budget, "rdp_committed": committed,
            "rdp_reserved": sum(held.values()), "rdp_peak_committed_plus_reserved": peak,
            "max_relative_difference_to_recorded": max_recorded_diff,
            "overspend": peak > budget * (1 + rel_tol)}


def ledger_single_client(p: Platform, dataset_id: str, settings: dict[str, Any],
                         out: Path) -> dict[str, Any]:
    """The same workload from ONE user on a budget it cannot exhaust: the baseline of the
    contention run (what the ledger does without concurrency)."""
    body = {"dataset_id": dataset_id, "target_epsilon": settings["ledger_target_epsilon"],
            **RESERVE_SHAPE}
    env = {"BENCH_RESERVE": json.dumps(body), "BENCH_LIFECYCLE_FRACTION": "0.5"}
    records = run_locust(p, "LedgerReserveUser", users=1, seconds=settings["ledger_single_s"],
                         env=env, host=p.ledger_url, out=out, tag="ledger-single")
    reserves = [r for r in records if r[0] == "reserve"]
    accepted = [r for r in reserves if r[3] == 201]
    start = min(r[1] for r in reserves)
    end = max(r[1] + r[2] for r in records)
    lat = [r[2] * 1000 for r in accepted]
    return {"users": 1, "accepted": len(accepted),
            "errors": sum(1 for r in records if r[3] not in (200, 201)),
            "admissions_per_s": len(accepted) / (end - start) if end > start else 0.0,
            "admission_p50_ms": percentile(lat, 50), "admission_p99_ms": percentile(lat, 99)}


def ledger_contention(p: Platform, dataset_id: str, settings: dict[str, Any],
                      out: Path) -> dict[str, Any]:
    """(b): reservations from many users against ONE budget until refused; then the checks."""
    from dpsynth_cli.ledger import verify_export
    from dpsynth_client import Client

    users = settings["ledger_users"]
    body = {"dataset_id": dataset_id, "target_epsilon": settings["ledger_target_epsilon"],
            **RESERVE_SHAPE}
    env = {"BENCH_RESERVE": json.dumps(body), "BENCH_LIFECYCLE_FRACTION": "0.5",
           "BENCH_STOP_AFTER_REFUSALS": str(users)}
    t0 = time.perf_counter()
    records = run_locust(p, "LedgerReserveUser", users=users, seconds=settings["ledger_max_s"],
                         env=env, host=p.ledger_url, out=out, tag="ledger-contention")
    wall = time.perf_counter() - t0
    reserves = [r for r in records if r[0] == "reserve"]
    accepted = [r for r in reserves if r[3] == 201]
    refused = [r for r in reserves if r[3] == 409 and r[4] == "privacy_budget_exhausted"]
    other = [r for r in records if r[3] not in (200, 201) and r not in refused]
    start = min(r[1] for r in reserves)
    last_accept = max((r[1] + r[2] for r in accepted), default=start)
    end = max(r[1] + r[2] for r in reserves)
    headers = {"Authorization": f"Bearer {p.ledger_token}"}
    view = httpx.get(f"{p.ledger_url}/v1/budgets/{dataset_id}", headers=headers,
                     timeout=60).json()
    with Client(p.api_url, p.api_key, timeout=300) as client:
        export = client.ledger_export(dataset_id)
        server_verify = client.ledger_verify(dataset_id)
    problems, signatures = verify_export(export)
    replay = replay_export(export)
    eps_total = view["dataset_epsilon_spent"] + view["dataset_epsilon_reserved"]
    view_ok = (view["rdp_spent"] + view["rdp_reserved"] <= view["rdp_budget"]
               and eps_total <= view["epsilon_limit"] * (1 + 1e-12))
    lat = [r[2] * 1000 for r in reserves]
    result = {
        "users": users, "wall_s": round(wall, 1),
        "reservation_request": body, "lifecycle_fraction": 0.5,
        "accepted": len(accepted), "refused": len(refused), "other_errors": len(other),
        "other_error_codes": sorted({f"{r[0]} {r[3]} {r[4]}".strip() for r in other}),
        "jobs_run_to_close": sum(1 for r in records if r[0] == "close" and r[3] == 200),
        "seconds_to_exhaustion": round(last_accept - start, 2),
        "admissions_per_s": len(accepted) / (last_accept - start) if accepted else 0.0,
        "decisions_per_s": len(reserves) / (end - start) if end > start else 0.0,
        "decision_p50_ms": percentile(lat, 50), "decision_p99_ms": percentile(lat, 99),
        "ledger_view": {k: view[k] for k in (
            "epsilon_limit", "delta", "admission_order", "rdp_budget", "rdp_spent",
            "rdp_reserved", "dataset_epsilon_spent", "dataset_epsilon_reserved",
            "dataset_epsilon_remaining")},
        "ledger_view_within_limit": view_ok,
        "replay": replay,
        "export_local_problems": problems, "export_signatures_checked": signatures,
        "server_verify_ok": bool(server_verify.get("ok")),
    }
    result["zero_overspend"] = (view_ok and not replay["overspend"] and not problems
                                and result["server_verify_ok"])
    print(f"  [ledger] users={users} accepted={len(accepted)} refused={len(refused)} "
          f"{result['admissions_per_s']:.2f} admissions/s, zero overspend: "
          f"{result['zero_overspend']}", flush=True)
    return result


# --------------------------------------------------------------------------- entry points


def rate_limits_in_force() -> dict[str, Any]:
    """The api's per-key rate limits during the run (issue 14, item 12): its defaults, or the
    ``DPSYNTH_API_RATE_LIMIT_*`` of this environment, which the embedded api inherits. Every
    request here uses one key, so a 429 in ``error_codes`` would mean the limits, not the
    services, set the rates."""
    from dpsynth_api.settings import ApiSettings

    limits: dict[str, Any] = {}
    for name, field in ApiSettings.model_fields.items():
        if name.startswith("rate_limit_") and name != "rate_limit_redis_url":
            limits[name] = os.environ.get(f"DPSYNTH_API_{name.upper()}", field.default)
    return limits


def run(scale: str) -> dict[str, Any]:
    """Start the platform, run (a) and (b) at ``scale``, stop it; the results document."""
    settings = SETTINGS[scale]
    t0 = time.perf_counter()
    # locust's own CSVs and the per-request records stay for inspection (out/ is not committed)
    out = ROOT / "out" / "bench" / NAME / "locust"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with embedded_platform() as p:
        started = time.perf_counter() - t0
        inputs = prepare(p, settings)
        print(f"  platform up in {started:.0f}s, inputs ready", flush=True)
        single = ledger_single_client(p, inputs["single_dataset_id"], settings, out)
        ledger = ledger_contention(p, inputs["contended_dataset_id"], settings, out)
        ledger["single_client"] = single
        ledger["ratio_to_single_client"] = (ledger["admissions_per_s"]
                                            / single["admissions_per_s"]
                                            if single["admissions_per_s"] else None)
        rows = submissions(p, inputs, settings, out)
    return {
        "settings": settings, "platform_start_s": round(started, 1),
        "workers": 0, "load_generator": "locust (FastHttpUser, closed loop, no think time)",
        # the uploaded model's pretraining (public noise; before any load is measured)
        "pretrain_cache": inputs["pretrain_cache"],
        "submissions": rows, "ledger": ledger, "rate_limits": rate_limits_in_force(),
    }


def _single_rows(led: dict[str, Any]) -> list[str]:
    single = led.get("single_client")
    if not single:
        return []
    ratio = led.get("ratio_to_single_client")
    return [f"| Same workload, 1 user, budget never exhausted: admissions/s (p50 / p99 ms) | "
            f"{fmt(single['admissions_per_s'])} ({fmt(single['admission_p50_ms'])} / "
            f"{fmt(single['admission_p99_ms'])}) |",
            f"| Ratio: contended / single-user admissions/s | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} |"]


def table_markdown(results: dict[str, Any]) -> str:
    """The two tables of ``docs/benchmarks.md``: submissions, then ledger contention."""
    lines = ["| Request | Users | Completed/s | Ratio to `/healthz` | p50 (ms) | p99 (ms) "
             "| Errors |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results["submissions"]:
        ratio = r.get("ratio_to_healthz")
        lines.append(f"| {r['scenario']} | {r['users']} | {fmt(r['rate_per_s'])} "
                     f"| {'—' if ratio is None else f'{ratio:.3f}'} | {fmt(r['p50_ms'])} "
                     f"| {fmt(r['p99_ms'])} | {r['errors']} |")
    led = results["ledger"]
    view = led["ledger_view"]
    rep = led["replay"]
    lines += [
        "",
        "| Ledger contention (one budget) | Value |", "|---|---:|",
        f"| Concurrent users | {led['users']} |",
        f"| Reservation asked | ε {led['reservation_request']['target_epsilon']}, "
        f"batch {led['reservation_request']['expected_batch_size']}, "
        f"{led['reservation_request']['steps']} steps |",
        f"| Budget | ε {view['epsilon_limit']}, δ {view['delta']:.0e}, "
        f"RDP {view['rdp_budget']:.4g} at order {view['admission_order']} |",
        f"| Accepted / refused | {led['accepted']} / {led['refused']} |",
        f"| Jobs taken to close (grant, lease half, close) | {led['jobs_run_to_close']} |",
        f"| Admissions/s until exhaustion | {fmt(led['admissions_per_s'])} |",
        *_single_rows(led),
        f"| Decisions/s (accepted + refused) | {fmt(led['decisions_per_s'])} |",
        f"| Decision latency p50 / p99 (ms) | {fmt(led['decision_p50_ms'])} / "
        f"{fmt(led['decision_p99_ms'])} |",
        f"| Other errors | {led['other_errors']} |",
        f"| Ledger view: committed + reserved RDP / budget | "
        f"{(view['rdp_spent'] + view['rdp_reserved']) / view['rdp_budget']:.4f} |",
        f"| Ledger view: ε spent + reserved / limit | "
        f"{view['dataset_epsilon_spent'] + view['dataset_epsilon_reserved']:.4f} / "
        f"{view['epsilon_limit']} |",
        f"| Replay of the export: peak committed + reserved RDP / budget | "
        f"{rep['rdp_peak_committed_plus_reserved'] / rep['rdp_budget']:.4f} "
        f"({rep['entries']} entries) |",
        f"| Export: hashes and {led['export_signatures_checked']} signatures checked locally; "
        f"server verify | {'ok' if not led['export_local_problems'] else 'PROBLEMS'}; "
        f"{'ok' if led['server_verify_ok'] else 'NOT OK'} |",
        f"| **Zero overspend** | **{'yes' if led['zero_overspend'] else 'NO'}** |",
    ]
    limits = results.get("rate_limits")
    if limits:  # issue 14, item 12: what the api would have refused above
        lines += ["", "Per-key rate limits in force (every request above uses one key): "
                  + ", ".join(f"`{k}` {v}" for k, v in sorted(limits.items())) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    doc = json.loads(bench_main(NAME, run).read_text())
    if not doc["results"]["ledger"]["zero_overspend"]:
        raise SystemExit("service_load: overspend check FAILED (see the results file)")
