"""`make demo`: the main dpsynth job end to end on the embedded platform, over HTTP.

public dataset → feature network and pretrain → private dataset with a budget and a
held-out part → DP finetune at a target epsilon → generate → evaluate (classifiers trained
on the synthetic corpus and tested on the private dataset's held-out records, the
feature-space Fréchet distance, precision/recall, memorisation; an owner-only, non-DP report)
→ download → the private data's contribution (the same corpus and classifier made from the
public base model alone) → the private dataset's signed ledger history, exported and verified.

Data: scikit-learn's digits (1,797 8x8 images, installed by pip). The client-side split is
seeded and fixed (``dpsynth samples digits``): 40% are public and 60% private. The public
corpus keeps only the public digits 0-4 (``PUBLIC_CLASSES``; 380 images, 20% of them held
out at upload to check the feature network): it serves pretraining and the feature
network, and it has never seen a 5-9. The private dataset (all ten digits) is uploaded with
``holdout_fraction`` 0.25: the platform sets about a quarter of the records aside (each by a
keyed hash of itself, so adding or removing one record moves no other), never trains on them
and uses them as the real test data of the evaluation. The DP finetune starts with the DP
central-image warm-up (DP-FETA: the per-class means of the private images, released once by
the Gaussian mechanism at epsilon ``CENTRAL_EPSILON`` = 4, charged to the budget; the
upload declares a public bound on every class's size for it; 1,500 warm-up steps on them)
and then DP-SGD at the target epsilon 2 (attention layers, 5 epochs); the dataset's budget
(limit 8) spends about 5.6 in all (RDP filter).

The private data's contribution (``private_contribution`` in summary.json; issue 18,
item 7). A second corpus is generated from the PUBLIC base model (the model before the DP
finetune, the same generate settings) and evaluated by a second evaluate job against the
SAME private dataset's held-out records, with the same classifier: the evaluation's CNN
(``dpsynth_cli.contribution.CLASSIFIER``, fixed in advance). With p1 the public-only
accuracy, p2 the DP-finetuned one and n the held-out size (both tested on the same n
records), the difference p2 - p1 has the standard error

    SE = sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)

(two binomial proportions taken as independent; sharing the test records correlates them
positively, so this SE is if anything too large and the check conservative). Its
``epsilon`` is the dataset's spent epsilon (RDP filter: the warm-up and DP-SGD together),
the guarantee the DP-finetuned corpus is released under. The demo prints whether
p2 - p1 >= 2 SE and exits 1 when it is not (``--require-private-contribution``, on by
default except with ``--quick``, whose smaller settings were never validated for it;
``--no-require-private-contribution`` only reports the comparison).

Why this design, and how its settings were chosen. With the whole public part (all ten
digits, as before issue 18) the public base model alone already gave 0.755 against 0.781
after the DP finetune on the test digits (+0.7 SE, n 278; the one measurement of the old
design the issue asked for): most of the class signal came from the public pretraining and
the private data added nothing measurable. Everything after that was chosen with
``--validation``, never on the test digits: the demo's held-out records (the platform's
keyed-hash split, computed here before upload) are removed from the private upload, and the
platform holds out a quarter of the remaining TRAINING records under another key as
validation records (n 186). On them, with all ten public digits, neither a longer DP
finetune (20 epochs, learning rate 1e-3: 0.763 vs 0.753 public only) nor the central-image
warm-up (0.731 vs 0.753) helped. Public data that misses what the private data holds is the
case private data is for: here half of the classes. With the public digits 0-4 only, a DP
finetune of the attention layers and class table without the warm-up (10 epochs) did not
teach the new digits (0.301 vs 0.409: it hurt); with the central-image warm-up it did (0.602
vs 0.409, +3.8 SE). The central epsilon (2) and warm-up (500 steps, DP-FETA's default) were
set a priori, not tuned. The chosen design was then run on the test digits with its settings
fixed (2026-11-26, n 278; the public-only corpus is seeded, the DP noise is drawn afresh
every run, so the DP-finetuned accuracy varies from run to run): public only 0.453 each
time; DP finetuned 0.525 (+0.072 = +1.7 SE), 0.572 (+0.119 = +2.8 SE) and 0.522 (+0.068 =
+1.6 SE), SE about 0.042, epsilon 5.39 spent. The private data helped (the base model alone
has never seen a 5-9), but not every run met the two-standard-error bar.

Issue 18, item 7 asks the demo to FAIL below that bar, so the design was strengthened, again
on the validation records only (2026-11-27, one run each, n 186; public only 0.387 each
time): the design above 0.489 (+2.0 SE); the release at epsilon 4 and DP-SGD at a target of
2 (the Fashion-MNIST table found the release carries most of what the private data gives at
CPU scale, and a few noisy DP-SGD steps little) 0.527 (+2.7 SE); the same with 1,500 warm-up
steps instead of 500 (the designer slice of Fashion-MNIST gained most from a longer
warm-up) 0.608 (+4.4 SE; the logistic regression 0.726). The last is the default. Its runs
on the test digits, settings fixed before them (n 278, 2026-11-27, three runs with
``--reuse-base-model``): public only 0.439 each time; DP finetuned 0.615 (+0.176 = +4.2 SE),
0.640 (+0.201 = +4.9 SE) and 0.691 (+0.252 = +6.2 SE), SE about 0.042, epsilon 5.59 spent;
a fourth, a plain ``make demo`` with a fresh pretraining, 0.554 (+0.115 = +2.7 SE): a run
below the bar is unlikely but not impossible.
The demo now takes about 9 minutes with a cached base model (12.5 with its pretraining): the
DP finetune took 372-398 s against 122-155 s with 500 warm-up steps.

Writes ``out/demo/summary.json`` and ``out/demo/report.html`` and exits 1 when the best
classifier trained on synthetic data is below twice chance (20%), the ledger history does
not verify, or the private data's contribution is below two standard errors (not checked
with ``--quick`` or ``--no-require-private-contribution``).

Settings (chosen on a 2-core CPU, validated on synthetic vs. public digits, never on the test
digits): 150 pretraining epochs (~800 UNet steps on the 0-4 public digits; with 30 epochs
the samples were barely class-conditional and the classifier scored ~0.25-0.3), guidance
scale 2. Prints per-phase timings and records them in summary.json under ``phase_seconds``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from dpsynth_cli.contribution import (
    CLASSIFIER,
    MIN_STANDARD_ERRORS,
    contribution_from_reports,
    contribution_shown,
)
from dpsynth_cli.embedded import EmbeddedPlatform
from dpsynth_cli.ledger import verify_export
from dpsynth_cli.samples import split_digits
from dpsynth_client import TERMINAL_STATES, Client

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out" / "demo"
CLASSES = [str(i) for i in range(10)]
HOLDOUT_KEY = "dpsynth-demo-holdout-20261122"  # fixed: the same records are held out each run
PRIVATE_HOLDOUT = 0.25
VALIDATION_KEY = "dpsynth-demo-validation-20261126"
"""``--validation``: the key that holds out validation records from the private TRAINING part."""
SIZE_ROUNDING = 100
"""The private dataset's public size N̂ is declared as the records uploaded rounded up to a
hundred: an upper bound on the training part the owner agrees to publish. The platform never
publishes a true count of private data (docs/privacy.md, "No exact private count without
DP"); a private upload states N̂ or asks for a charged DP count (``size_epsilon``)."""
PUBLIC_HOLDOUT = 0.2
CLASS_SIZE_ROUNDING = 10
"""The per-class sizes the private upload declares (the central images need them): the
largest class of the upload rounded up to ten, for every class (an upper bound on each
class's training records, as N̂ is on the total)."""
PUBLIC_CLASSES = "0,1,2,3,4"
"""The digits the public corpus keeps: the public part of the split restricted to 0-4, so the
digits 5-9 can come only from the private data (see the docstring)."""
CENTRAL_EPSILON = 4.0
PHASES: dict[str, float] = {}
CACHE = OUT.parent / "demo-cache"
"""Base models pretrained by earlier runs on the public digits only (`--reuse-base-model`)."""
QUICK_PRETRAIN_EPOCHS = 40
QUICK_SAMPLES_PER_CLASS = 30


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time one phase of the demo (wall seconds, recorded in summary.json)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        PHASES[name] = round(PHASES.get(name, 0.0) + time.monotonic() - t0, 1)


def private_training_part(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray,
                                                                          np.ndarray]:
    """The private digits the platform would NOT hold out under ``HOLDOUT_KEY`` (the same
    keyed-hash rule it applies at upload), for ``--validation``."""
    from dpsynth_shared.record_splits import in_first_part, record_hashes

    held = in_first_part(HOLDOUT_KEY.encode(), record_hashes(images), PRIVATE_HOLDOUT)
    return images[~held], labels[~held]


def write_npz(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    np.savez(path, images=images, labels=labels)
    return path


def watch(client: Client, job_id: str, what: str, *, stall_s: float) -> dict:
    """Wait for a job, printing data-independent progress (step/total, epsilon, ETA).

    No fixed deadline (a slow or loaded machine only takes longer): the demo gives up only
    when the job shows no sign of life (no state, step or heartbeat change) for ``stall_s``.
    """
    last, seen, alive_at = "", None, time.monotonic()
    while True:
        job = client.get_job(job_id)
        p = job.get("progress") or {}
        eps = p.get("epsilon_so_far")
        line = (f"  {what}: {job['state']:<10} step {p.get('step', 0)}/{p.get('total', 0)}"
                + (f"  epsilon so far {eps:.3f}" if eps is not None else "")
                + (f"  ETA {p['eta_s']:.0f}s" if p.get("eta_s") is not None else ""))
        if line != last:
            print(line, flush=True)
            last = line
        if job["state"] in TERMINAL_STATES:
            break
        sign = (job["state"], p.get("step"), job.get("heartbeat_at"), job.get("attempt"))
        if sign != seen:
            seen, alive_at = sign, time.monotonic()
        elif time.monotonic() - alive_at > stall_s:
            raise SystemExit(f"{what} ({job_id}) showed no progress and no heartbeat for "
                             f"{stall_s:.0f} s; see the worker's log under "
                             f"{OUT / 'platform' / 'logs'} (--stall-minutes waits longer)")
        time.sleep(2.0)
    if job["state"] != "succeeded":
        raise SystemExit(f"{what} ended {job['state']}: {job.get('error')}")
    return job


def base_model(client: Client, args: argparse.Namespace,
               public_id: str) -> tuple[dict | None, str]:
    """Pretrain the public base model, or with ``--reuse-base-model`` upload the one an
    earlier run pretrained with the same settings. Returns (the pretrain job or None, id)."""
    spec = {"type": "pretrain", "name": "demo-pretrain", "dataset_id": public_id,
            "preset": "small", "image_size": args.image_size, "channels": 1,
            "class_conditional": True, "epochs": args.pretrain_epochs, "seed": 0}
    classes = "" if args.public_classes == ",".join(CLASSES) else \
        "-classes" + args.public_classes.replace(",", "")
    cached = CACHE / f"base-small-{args.image_size}px-{args.pretrain_epochs}ep-seed0{classes}.zip"
    if args.reuse_base_model and cached.exists():
        model = client.upload_model(cached, name="demo-base-model (cached)")
        print(f"   reused the base model pretrained by an earlier run ({cached}): "
              f"{model['model_id']}", flush=True)
        return None, model["model_id"]
    pre = watch(client, client.submit_job(spec)["job_id"], "pretrain",
                stall_s=args.stall_minutes * 60)
    model_id = pre["result"]["model_id"]
    CACHE.mkdir(parents=True, exist_ok=True)
    client.download_model(model_id, cached)
    return pre, model_id


def corpus_manifest(zip_path: Path, dest: Path) -> dict:
    """Extract the downloaded corpus and return its manifest (the release's)."""
    if dest.exists():
        shutil.rmtree(dest)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(dest)
    return json.loads((dest / "manifest.json").read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's settings: the command line over the defaults above, with ``--quick``'s
    smaller settings applied and the private-contribution check resolved (on unless
    ``--quick`` or ``--no-require-private-contribution``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target-epsilon", type=float, default=2.0)
    parser.add_argument("--epsilon-limit", type=float, default=8.0)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--pretrain-epochs", type=int, default=150)
    parser.add_argument("--guidance-scale", type=float, default=2.0)
    parser.add_argument("--samples-per-class", type=int, default=60)
    parser.add_argument("--keep", action="store_true", help="leave the platform running")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller setting for a slow or loaded machine: 40 pretraining "
                        "epochs and 30 samples per class (about a third of the time; the "
                        "synthetic digits are weaker)")
    parser.add_argument("--reuse-base-model", action="store_true",
                        help="upload the public base model an earlier run pretrained with the "
                        f"same settings (cached under {CACHE}) instead of pretraining again; "
                        "it saw only the public digits, so reusing it spends no budget")
    parser.add_argument("--public-classes", default=PUBLIC_CLASSES,
                        help="the digits the public corpus holds (comma-separated; the other "
                        "public images are left out)")
    parser.add_argument("--finetune-epochs", type=float, default=5.0)
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--trainable", default="attention",
                        choices=["attention", "output_attention", "full", "lora"])
    parser.add_argument("--train-embedder", action=argparse.BooleanOptionalAction,
                        default=False, help="the DP finetune trains the class table too")
    parser.add_argument("--require-private-contribution",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="exit 1 unless the DP-finetuned corpus's classifier beats the "
                        "public-only corpus's by at least two standard errors (on by "
                        "default, off with --quick, whose smaller settings were never "
                        "validated for it; --no-require-private-contribution only reports "
                        "the comparison)")
    parser.add_argument("--central-epsilon", type=float, default=CENTRAL_EPSILON,
                        help="epsilon of the DP central-image warm-up of the finetune (0: none)")
    parser.add_argument("--central-warmup-steps", type=int, default=1500)
    parser.add_argument("--validation", action="store_true",
                        help="choose settings without the test digits: the private upload is "
                        "only the TRAINING part of the private digits (the records the demo "
                        "holds out are removed here, before upload) and the platform holds "
                        "out a quarter of it under another key as validation records; the "
                        "test digits are never uploaded")
    parser.add_argument("--stall-minutes", type=float, default=15.0,
                        help="give up on a job only when it shows no progress and no "
                        "heartbeat for this long (there is no fixed deadline)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pretrain_epochs = min(args.pretrain_epochs, QUICK_PRETRAIN_EPOCHS)
        args.samples_per_class = min(args.samples_per_class, QUICK_SAMPLES_PER_CLASS)
    if args.require_private_contribution is None:
        args.require_private_contribution = not args.quick
    return args


def main() -> int:
    args = parse_args()
    if args.validation:  # its own folder: the demo's outputs stay as they are
        global OUT
        OUT = ROOT / "out" / "demo-validation"
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    home = OUT / "platform"
    if home.exists():
        shutil.rmtree(home)
    data = split_digits()
    if args.validation:
        data["private"] = private_training_part(*data["private"])
    keep = np.isin(data["public"][1], [int(c) for c in args.public_classes.split(",")])
    data["public"] = (data["public"][0][keep], data["public"][1][keep])
    public_npz = write_npz(OUT / "public.npz", *data["public"])
    private_npz = write_npz(OUT / "private.npz", *data["private"])

    print("Starting the embedded platform (PostgreSQL, Redis, ledger, api, worker)...", flush=True)
    platform = EmbeddedPlatform(home)
    with phase("platform_start"):
        platform.start()
    try:
        creds = json.loads(platform.credentials_file.read_text())
        print(f"  api: {creds['api_url']}   credentials: {platform.credentials_file}")
        client = Client(creds["api_url"], creds["api_key"])
        summary = run_journey(client, args, data, public_npz, private_npz)
    finally:
        if not args.keep:
            print("Stopping the platform.", flush=True)
            with phase("platform_stop"):
                platform.stop()
    summary["wall_time_s"] = round(time.monotonic() - started, 1)
    summary["phase_seconds"] = dict(PHASES)
    print("\nPhase timings (wall seconds):")
    for name, seconds in PHASES.items():
        print(f"  {name:<16} {seconds:7.1f}")
    print(f"  {'total':<16} {summary['wall_time_s']:7.1f}")
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nSummary written to {OUT / 'summary.json'} ({summary['wall_time_s']} s)")
    failure = failure_of(summary, require_private_contribution=args.require_private_contribution)
    if failure:
        print(f"FAIL: {failure}")
        return 1
    return 0


def failure_of(summary: dict, *, require_private_contribution: bool) -> str | None:
    """Why the demo fails (its exit status 1), or None: the ledger's history does not verify,
    the best classifier trained on synthetic digits is below twice chance, or (when required)
    the private data's contribution is below two standard errors
    (:func:`dpsynth_cli.contribution.contribution_shown`)."""
    if not summary["ledger_verified"]:
        return "the ledger's history did not verify"
    if summary["classifier_accuracy"] < 0.2:
        return ("the best classifier trained on synthetic digits is below twice chance (0.2) "
                "on the held-out real digits")
    c = summary["private_contribution"]
    if require_private_contribution and not contribution_shown(c):
        return (f"the DP-finetuned corpus's {CLASSIFIER} accuracy "
                f"({c['dp_finetuned_accuracy']:.3f}) is not above the public-only one "
                f"({c['public_only_accuracy']:.3f}) by {MIN_STANDARD_ERRORS:g} standard errors "
                f"({MIN_STANDARD_ERRORS:g} x {c['standard_error']:.3f})")
    return None


def run_journey(client: Client, args: argparse.Namespace, data: dict, public_npz: Path,
                private_npz: Path) -> dict:
    print(f"1. Upload the public dataset (the public digits {args.public_classes} only; 20% "
          "held out at upload to check the feature network)", flush=True)
    with phase("upload_public"):
        public = client.upload_dataset(public_npz, name="digits-public", visibility="public",
                                       label_domain=CLASSES, holdout_fraction=PUBLIC_HOLDOUT,
                                       holdout_key=HOLDOUT_KEY)
    print(f"   {public['dataset_id']}: {public['declared_size']} training images, "
          f"{public.get('holdout_size')} held out")

    print("2. Pretrain (non-private) on the public dataset, and train the feature network "
          "of the evaluation on it", flush=True)
    with phase("pretrain"):
        pre, base_model_id = base_model(client, args, public["dataset_id"])
    with phase("feature_net"):
        feat = client.submit_job({"type": "feature_net", "name": "demo-feature-network",
                                  "dataset_id": public["dataset_id"],
                                  "image_size": args.image_size, "channels": 1,
                                  "epochs": 30, "seed": 0})
        feat = watch(client, feat["job_id"], "feature network", stall_s=args.stall_minutes * 60)
    feature_model_id = feat["result"]["model_id"]
    print(f"   feature network {feature_model_id}: accuracy "
          f"{feat['result'].get('accuracy', float('nan')):.3f} on held-out public digits")

    declared = -(-len(data["private"][1]) // SIZE_ROUNDING) * SIZE_ROUNDING
    print(f"3. Upload the private dataset with a budget of epsilon {args.epsilon_limit}; "
          f"{PRIVATE_HOLDOUT:.0%} of it is held out by the platform for evaluation. Its public "
          f"size N̂ = {declared} is declared (the records uploaded, rounded up: an upper bound "
          "on the training part; the true count is never published)", flush=True)
    counts = np.bincount(data["private"][1], minlength=len(CLASSES))
    class_bound = -(-int(counts.max()) // CLASS_SIZE_ROUNDING) * CLASS_SIZE_ROUNDING
    with phase("upload_private"):
        private = client.upload_dataset(private_npz, name="digits-private",
                                        visibility="private", declared_size=declared,
                                        class_sizes={c: class_bound for c in CLASSES}
                                        if args.central_epsilon else None,
                                        epsilon_limit=args.epsilon_limit, label_domain=CLASSES,
                                        holdout_fraction=PRIVATE_HOLDOUT,
                                        holdout_key=VALIDATION_KEY if args.validation
                                        else HOLDOUT_KEY)
    print(f"   {private['dataset_id']}: declared size N̂ {private['declared_size']} "
          f"({private.get('declared_size_source')}; it bounds the training records only), "
          f"{private.get('holdout_size')} held out (owner view), delta {private['delta']:.2e}")

    finetune_spec = {
        "type": "finetune", "name": "demo-dp-finetune", "dataset_id": private["dataset_id"],
        "base_model_id": base_model_id,
        "privacy": {"target_epsilon": args.target_epsilon, "max_grad_norm": 1.0},
        "training": {"trainable": args.trainable, "expected_batch_size": 128,
                     "epochs": args.finetune_epochs, "learning_rate": args.finetune_lr,
                     "class_conditional": True, "label_dropout": 0.1,
                     "class_map": {c: c for c in CLASSES},
                     "train_embedder": args.train_embedder},
    }
    if args.central_epsilon:
        finetune_spec["training"]["central_images"] = {
            "target_epsilon": args.central_epsilon, "downsample": 2,
            "warmup_steps": args.central_warmup_steps}
    with phase("finetune"):
        plan = client.submit_job(finetune_spec, dry_run=True)
        print("4. DP finetune, dry run first:")
        print(json.dumps(plan, indent=2)[:1500])
        for warning in plan.get("warnings") or []:
            print(f"   note: {warning}")
        ft = client.submit_job(finetune_spec)
        ft = watch(client, ft["job_id"], "DP finetune", stall_s=args.stall_minutes * 60)
    dp_model_id = ft["result"]["model_id"]

    print("5. Generate a synthetic corpus (costs no budget)", flush=True)
    with phase("generate"):
        gen = client.submit_job(generate_spec(args, dp_model_id, "demo-synthetic-digits"))
        gen = watch(client, gen["job_id"], "generate", stall_s=args.stall_minutes * 60)
        corpus = next(a for a in client.job_artifacts(gen["job_id"]) if a["kind"] == "corpus")

    print("6. Evaluate the corpus against the private dataset's held-out records (non-DP, "
          "owner-only report; no epsilon charged, recorded in the ledger)", flush=True)
    with phase("evaluate"):
        ev = client.submit_job({"type": "evaluate", "name": "demo-evaluation",
                                "corpus_artifact_id": corpus["artifact_id"],
                                "dataset_id": private["dataset_id"],
                                "feature_model_id": feature_model_id, "seed": 0})
        ev = watch(client, ev["job_id"], "evaluate", stall_s=args.stall_minutes * 60)
        report = client.get_report(ev["job_id"])
        report_html = OUT / "report.html"
        client.download_report(ev["job_id"], report_html, format="html")
    headline = report["headline"]
    print_headline(report)
    with phase("download"):
        corpus_zip = OUT / "corpus.zip"
        client.download_artifact(corpus["artifact_id"], corpus_zip)
        manifest = corpus_manifest(corpus_zip, OUT / "corpus")
    listed = [e.get("job_id") for e in manifest.get("non_dp_evaluations") or []]
    print(f"   the corpus manifest lists the non-DP evaluations that preceded its release: "
          f"{listed}")
    budget = client.get_budget(private["dataset_id"])
    print_budget(budget)
    contribution, public_only = public_only_baseline(
        client, args, base_model_id=base_model_id, private_id=private["dataset_id"],
        dp_report=report, epsilon=budget["dataset_epsilon_spent"])
    print("\n8. Audit the ledger: export the dataset's signed history and verify it", flush=True)
    with phase("audit"):
        audit = audit_ledger(client, private["dataset_id"])
    tstr = headline.get("tstr_accuracy") or {}
    accuracy = max(tstr.values()) if tstr else 0.0
    guarantee = guarantee_of(private, budget)
    print(f"\nWhat the guarantee covers: {guarantee['covers']}")
    print(f"\nSynthetic corpus: {corpus_zip} (extracted in {OUT / 'corpus'})")
    print(f"Evaluation report: {report_html} (owner-only, non-DP: it shows private images)")
    return {
        "public_dataset_id": public["dataset_id"], "private_dataset_id": private["dataset_id"],
        "pretrain_job_id": pre["job_id"] if pre else None,
        "base_model_source": "pretrained" if pre else "cache", "feature_net_job_id": feat["job_id"],
        "finetune_job_id": ft["job_id"], "generate_job_id": gen["job_id"],
        "evaluate_job_id": ev["job_id"], "guarantee": guarantee,
        "base_model_id": base_model_id, "dp_model_id": dp_model_id,
        "feature_model_id": feature_model_id,
        "corpus_artifact_id": corpus["artifact_id"], "corpus_path": str(corpus_zip),
        "report_path": str(report_html),
        "epsilon_budget": budget["epsilon_limit"],
        "epsilon_spent": budget["dataset_epsilon_spent"],
        "tight_epsilon": budget["dataset_tight_epsilon"],
        "tight_epsilon_label": budget.get("dataset_tight_epsilon_label"),
        "delta": budget["delta"], "admission_order": budget["admission_order"],
        "accountant": budget["accountant"], "job_epsilon": manifest.get("job_epsilon"),
        "classifier_accuracy": accuracy, "headline": headline,
        "test_images": report.get("sizes", {}).get("real_holdout"),
        "manifest_non_dp_evaluations": listed,
        "private_contribution": contribution, "public_only": public_only,
        "ledger_export": audit["path"], "ledger_entries": audit["entries"],
        "ledger_verified": audit["ok"], "dashboard_url": audit["dashboard"],
        "settings": {"image_size": args.image_size, "pretrain_epochs": args.pretrain_epochs,
                     "target_epsilon": args.target_epsilon,
                     "epsilon_limit": args.epsilon_limit,
                     "guidance_scale": args.guidance_scale,
                     "samples_per_class": args.samples_per_class,
                     "private_holdout_fraction": PRIVATE_HOLDOUT, "quick": args.quick,
                     "reuse_base_model": args.reuse_base_model,
                     "validation": args.validation, "public_classes": args.public_classes,
                     "finetune_epochs": args.finetune_epochs, "finetune_lr": args.finetune_lr,
                     "trainable": args.trainable, "train_embedder": args.train_embedder,
                     "central_epsilon": args.central_epsilon,
                     "central_warmup_steps": args.central_warmup_steps,
                     "require_private_contribution": args.require_private_contribution},
    }


def generate_spec(args: argparse.Namespace, model_id: str, name: str) -> dict:
    """The generate job of the demo; the DP-finetuned and the public-only corpora share it."""
    return {"type": "generate", "name": name, "model_id": model_id,
            "samples_per_class": args.samples_per_class, "sampler": "ddim", "steps": 50,
            "guidance_scale": args.guidance_scale, "seed": 0}


def public_only_baseline(client: Client, args: argparse.Namespace, *, base_model_id: str,
                         private_id: str, dp_report: dict, epsilon: float) -> tuple[dict, dict]:
    """Step 7: what the private data adds. A corpus from the PUBLIC base model (the model
    before the DP finetune, same generate settings) is evaluated against the same private
    dataset's held-out records with the same classifier protocol; its accuracy is compared
    with the DP-finetuned corpus's (``dpsynth_cli.contribution``). Returns
    (private_contribution, the public-only jobs)."""
    print(f"\n7. The private data's contribution: a corpus from the PUBLIC base model (no "
          f"private data, same generate settings), the same {CLASSIFIER} classifier "
          "trained on it and tested on the same held-out private records", flush=True)
    with phase("public_only"):
        gen = client.submit_job(generate_spec(args, base_model_id, "demo-public-only-digits"))
        gen = watch(client, gen["job_id"], "generate (public only)",
                    stall_s=args.stall_minutes * 60)
        corpus = next(a for a in client.job_artifacts(gen["job_id"]) if a["kind"] == "corpus")
        ev = client.submit_job({"type": "evaluate", "name": "demo-public-only-evaluation",
                                "corpus_artifact_id": corpus["artifact_id"],
                                "dataset_id": private_id, "classifiers": [CLASSIFIER],
                                "seed": 0})
        ev = watch(client, ev["job_id"], "evaluate (public only)",
                   stall_s=args.stall_minutes * 60)
        report = client.get_report(ev["job_id"])
    contribution = contribution_from_reports(report, dp_report, classifier=CLASSIFIER,
                                             epsilon=epsilon)
    c = contribution
    z = c["difference"] / c["standard_error"] if c["standard_error"] else float("nan")
    print(f"   {CLASSIFIER} accuracy on {c['n_test']} held-out private digits: public "
          f"only {c['public_only_accuracy']:.3f}, DP finetuned (epsilon {c['epsilon']:.2f}) "
          f"{c['dp_finetuned_accuracy']:.3f}; difference {c['difference']:+.3f} = {z:+.1f} SE "
          f"(SE {c['standard_error']:.3f} = sqrt(p1(1-p1)/n + p2(1-p2)/n), n {c['n_test']})")
    shown = contribution_shown(contribution)
    print(f"   the private data {'helps' if shown else 'does NOT measurably help'}: the "
          f"difference is {'at least' if shown else 'below'} {MIN_STANDARD_ERRORS:g} standard "
          "errors", flush=True)
    return contribution, {"generate_job_id": gen["job_id"], "evaluate_job_id": ev["job_id"],
                          "corpus_artifact_id": corpus["artifact_id"],
                          "classifier": CLASSIFIER, "shown": shown}


def guarantee_of(private: dict, budget: dict) -> dict:
    """What the dataset's (epsilon, delta) speaks of: its training part, at the declared N̂."""
    return {
        "covers": (f"the training part of the private upload (the held-out records are read "
                   f"only by the non-DP, owner-only evaluation): (epsilon "
                   f"{budget['dataset_epsilon_spent']:.3f} spent, delta {budget['delta']:.0e}) "
                   f"bounds what the DP finetune and everything made from it reveal about "
                   f"adding or removing any one training record; public size N̂ = "
                   f"{private['declared_size']} ({private.get('declared_size_source')})"),
        "unit": private.get("privacy_unit") or "image",
        "neighbouring": private.get("neighbouring"),
        "declared_size": private["declared_size"],
        "declared_size_source": private.get("declared_size_source"),
        "epsilon_spent": budget["dataset_epsilon_spent"], "delta": budget["delta"],
    }


def print_headline(report: dict) -> None:
    """The evaluation's headline numbers (as ``dpsynth report`` prints them)."""
    h = report["headline"]
    sizes = report.get("sizes", {})
    print(f"   synthetic {sizes.get('synthetic')}, real training {sizes.get('real_train')}, "
          f"real held-out {sizes.get('real_holdout')} images")
    for name, acc in (h.get("tstr_accuracy") or {}).items():
        real = (h.get("real_accuracy") or {}).get(name)
        print(f"   {name:<8} trained on synthetic: {acc:.3f}   on real: "
              f"{real if real is None else format(real, '.3f')}   (chance 0.100)")
    if h.get("fd_dpsynth") is not None:
        print(f"   Fréchet distance in the feature network's space (not FID): "
              f"{h['fd_dpsynth']:.2f}  (real vs real floor "
              f"{_num(h.get('fd_dpsynth_real_train'))})")
    if h.get("precision") is not None:
        print(f"   precision {h['precision']:.3f}  recall {h['recall']:.3f}  density "
              f"{h['density']:.3f}  coverage {h['coverage']:.3f}")
    if h.get("memorisation_flagged") is not None:
        print(f"   memorisation: {h['memorisation_flagged']} synthetic images flagged; "
              f"{_num(h.get('memorisation_fraction_closer_to_train'))} closer to a training "
              "image than to any held-out one (about the training share when nothing is "
              "memorised)")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def audit_ledger(client: Client, dataset_id: str) -> dict:
    """Export the dataset's ledger, verify every hash and signature here (as
    ``dpsynth ledger verify`` does), and ask the ledger to replay it too."""
    export = client.ledger_export(dataset_id)
    path = OUT / "ledger.json"
    path.write_text(json.dumps(export, indent=2))
    problems, signatures = verify_export(export)
    report = client.ledger_verify(dataset_id)
    ok = not problems and bool(report.get("ok"))
    print(f"   {len(export['entries'])} entries written to {path}; {signatures} Ed25519 "
          f"signatures and every hash checked locally: {'ok' if not problems else problems}")
    print(f"   the ledger's replay of every charge and epsilon: "
          f"{'ok' if report.get('ok') else report.get('problems')}")
    dashboard = f"{client.base_url}/dashboard"
    print(f"   budget dashboard: {dashboard} (run `python scripts/demo.py --keep` to keep the "
          "platform up and browse it with the api key from the credentials file)")
    return {"path": str(path), "entries": len(export["entries"]), "ok": ok,
            "dashboard": dashboard}


def print_budget(budget: dict) -> None:
    print("\nPrivacy budget of the private dataset:")
    print(f"  limit                 {budget['epsilon_limit']:.3f}  (delta {budget['delta']:.2e})")
    print(f"  spent (RDP filter)    {budget['dataset_epsilon_spent']:.3f}  "
          f"(admission order {budget['admission_order']})")
    print(f"  tight (PLD)           {budget['dataset_tight_epsilon']:.3f}  "
          "(if the sequence had been fixed in advance; not a guarantee under adaptive use)")
    print(f"  reserved              {budget['dataset_epsilon_reserved']:.3f}")
    print(f"  remaining             {budget['dataset_epsilon_remaining']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
