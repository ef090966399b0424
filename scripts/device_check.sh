#!/usr/bin/env bash
# The checks to run whenever a GPU machine is available (issue 17): at most 6 minutes in all.
#
#   bash scripts/device_check.sh OUTDIR [--tiny]
#
# Writes, as it goes (so a time limit still leaves data):
#   OUTDIR/device.json          the machine: host, nvidia-smi, Python, packages, torch/CUDA
#   OUTDIR/engine_rows.jsonl    one line per measured process (benchmarks/engine_cost.py)
#   OUTDIR/engine_summary.json  the engine ratios so far, rewritten after each process
#   OUTDIR/summary.json         the final summary (ratios per trainable set and engine,
#                               best engine per set, the machine)
#   OUTDIR/phase_throughput.json  images/s per ML phase on the device (issue 18): non-private
#                               pretraining (latent, pixel), a whole-dataset and a per-label
#                               DP finetune, sampling; each row names the device its phase
#                               actually ran on; on a GPU a short CPU reference beside it
#                               (benchmarks/phase_throughput.py), rewritten after each phase
#   OUTDIR/pytest_gpu.log       the GPU tests (tests/unit/ml: every phase on the device, the
#                               noise on CUDA, the white-box privacy audit with 200,000
#                               canaries); with --tiny or no CUDA they run and skip
#   OUTDIR/fmnist_no_public.gpu.json  the gpu-smoke results (a GPU only; .json if a phase
#                               did not run on CUDA), or fmnist_no_public.progress.json with
#                               the cells done when the time limit stopped it
#   OUTDIR/device_check.log     everything printed
#
# Without --tiny: CUDA when torch sees it (preset "base", batch 64, 7 interleaved DP /
# non-DP rounds as far as the budget allows), else the CPU with small settings. --tiny runs
# the identical code path on the CPU with the tiny preset, batch 4 and 2 rounds (the test);
# its phase throughput is the tiny profile (a few steps per phase, on the CPU). The budget is
# shared: the engine rows get what the phase throughput (45 s kept on a GPU, 90 s on the CPU)
# and, on a GPU with benchmarks/fmnist_no_public.py present, the gpu-smoke benchmark (215 s
# kept; it took 201 s on an H200: two cells of ~80 s and the direct rows) leave: about 50 s
# on a GPU at the default budget, one or two interleaved rounds.
#
# Runs from a plain copy of the repository: .venv/bin/python when present, else python3,
# with shared/src, services/worker/src and the repository root on PYTHONPATH, so dpsynth_ml,
# dpsynth_shared and benchmarks import uninstalled. Third-party packages it needs: torch,
# diffusers, opacus, peft, numpy (diffusers' and peft's own dependencies with them); on the
# GPU machines, whose image lacks diffusers and opacus, carry the wheels that
# scripts/device_wheels.sh downloads (carry=[".whl"]).
# DEVICE_CHECK_BUDGET_S overrides the total budget (seconds, default 360).
set -euo pipefail

usage() { echo "usage: $0 OUTDIR [--tiny]" >&2; exit 2; }

outdir=""
tiny=0
for arg in "$@"; do
  case "$arg" in
    --tiny) tiny=1 ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $arg" >&2; usage ;;
    *) [[ -z "$outdir" ]] || usage; outdir="$arg" ;;
  esac
done
[[ -n "$outdir" ]] || usage

budget_s="${DEVICE_CHECK_BUDGET_S:-360}"
start_s=$(date +%s)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)"
log="$outdir/device_check.log"
cd "$root"

if [[ -x .venv/bin/python ]]; then
  py="$root/.venv/bin/python"
elif command -v python3 >/dev/null 2>&1; then
  py="$(command -v python3)"
else
  py="$(command -v python)"
fi
export PYTHONPATH="$root/shared/src:$root/services/worker/src:$root/services/ledger/src:$root${PYTHONPATH:+:$PYTHONPATH}"
# Fashion-MNIST carried as .fmnist/ (scripts/device_wheels.sh) where the machine has no
# Debian dataset-fashion-mnist
if [[ -z "${DPSYNTH_FMNIST_DIR:-}" && -f "$root/.fmnist/train-images-idx3-ubyte.gz" ]]; then
  export DPSYNTH_FMNIST_DIR="$root/.fmnist"
fi
# Wheels carried to a machine that lacks packages (scripts/device_wheels.sh fills .whl/ on a
# machine with a package index): installed into a scratch folder, LAST on the path, so the
# image's own packages and the repository (opacus ships a top-level "benchmarks") come first.
# Only where the interpreter lacks them (a developer's venv has them, and the wheels are
# built for the machine's Python 3.12).
if compgen -G "$root/.whl/*.whl" >/dev/null \
    && ! "$py" -c "import diffusers, opacus, pydantic, dp_accounting" >/dev/null 2>&1; then
  site="${TMPDIR:-/tmp}/device-check-site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$root"/.whl/*.whl
  export PYTHONPATH="$PYTHONPATH:$site"
fi
export PYTHONWARNINGS=ignore
# opacus ships an unrelated top-level "benchmarks" package: the repository root (cwd, and
# first on PYTHONPATH after the sources) must win; -m from the root puts cwd first.

remaining() { echo $(( budget_s - ($(date +%s) - start_s) )); }
say() { echo "[device_check] $*" | tee -a "$log"; }
# run LIMIT_S CMD...: CMD under a hard limit (SIGTERM, then SIGKILL 5 s later), its output
# appended to the log; prints nothing on success, returns CMD's status (124 on timeout)
run_limited() {
  local limit="$1"; shift
  if (( limit < 1 )); then say "no time left for: $*"; return 124; fi
  local rc=0
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$log" || rc=$?
  return "$rc"
}

say "start $(date -u +%FT%TZ) python=$py budget=${budget_s}s tiny=$tiny out=$outdir"

# 1. the machine, first
limit=$(( $(remaining) < 60 ? $(remaining) : 60 ))
if ! run_limited "$limit" "$py" -m benchmarks.engine_cost device --to "$outdir/device.json"; then
  say "device description failed; writing a minimal device.json"
  gpus="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null \
    | tr -d '"\\' | tr '\n' ';' || true)"
  printf '{"hostname": "%s", "error": "python device description failed", "nvidia_smi": "%s"}\n' \
    "${HOSTNAME:-unknown}" "$gpus" > "$outdir/device.json"
fi

# 2. the GPU tests (at most 60 s; the repository's own conftest files above tests/unit/ml
# need the platform's servers, so they are cut off: these tests use none)
limit=$(( $(remaining) < 60 ? $(remaining) : 60 ))
trc=0
run_limited "$limit" "$py" -m pytest -q -p no:cacheprovider --confcutdir=tests/unit/ml \
  -o addopts=-ra tests/unit/ml/test_gpu_phases.py tests/unit/ml/test_device_draws.py \
  tests/unit/ml/test_noise_source.py tests/unit/ml/test_distributed_dp.py \
  tests/unit/ml/test_whitebox_audit.py tests/unit/ml/test_finetune_audit.py -k "on_the_gpu or on_cuda or gpu_model" > "$outdir/pytest_gpu.log" 2>&1 || trc=$?
say "GPU tests: status $trc ($(tail -1 "$outdir/pytest_gpu.log"))"

# 3. the engine rows
if (( tiny )); then
  profile=tiny
else
  cuda="$("$py" -c 'import json, sys
print(json.load(open(sys.argv[1])).get("torch", {}).get("cuda_available", False))' \
    "$outdir/device.json" 2>/dev/null || echo False)"
  if [[ "$cuda" == "True" ]]; then profile=gpu; else profile=cpu; fi
fi
# seconds kept for what follows the engine rows: the summary, the phase throughput and
# (a GPU, not --tiny, its file present) the gpu-smoke benchmark
# (on an H200 the five GPU phases took 29 s of a 47 s box, and the gpu-smoke benchmark 201 s;
# with 90 s and 230 s kept, a 360 s budget left the engine rows nothing: 2026-11-27)
if (( tiny )); then phase_s=75; elif [[ "$profile" == gpu ]]; then phase_s=45; else phase_s=90; fi
smoke_s=0
if (( ! tiny )) && [[ "$profile" == gpu && -f benchmarks/fmnist_no_public.py ]]; then
  smoke_s=${DEVICE_CHECK_SMOKE_S:-215}
fi
reserve=$(( 15 + phase_s + smoke_s ))
limit=$(( $(remaining) - reserve ))
say "engine rows: profile=$profile, ${limit}s left for them"
rc=0
run_limited "$limit" "$py" -m benchmarks.engine_cost run --out "$outdir" --profile "$profile" \
  --budget-s "$(( limit > 15 ? limit - 10 : limit ))" --quiet || rc=$?
(( rc == 0 )) || say "engine rows ended with status $rc (124: the time limit); rows kept"

# 4. the summary, from whatever rows were written
limit=$(( $(remaining) < 20 ? $(remaining) : 20 ))
src=0
run_limited "$(( limit < 5 ? 5 : limit ))" "$py" -m benchmarks.engine_cost summarize \
  --out "$outdir" || src=$?

# 5. per-phase throughput (benchmarks/phase_throughput.py), in what the smoke run leaves
limit=$(( $(remaining) - smoke_s ))
(( limit <= phase_s + 10 )) || limit=$(( phase_s + 10 ))
say "phase throughput: profile=$profile, ${limit}s left for it"
prc=0
run_limited "$limit" "$py" -m benchmarks.phase_throughput --out "$outdir" \
  --profile "$profile" --budget-s "$(( limit > 20 ? limit - 10 : (limit > 2 ? limit - 2 : 1) ))" \
  || prc=$?
(( prc == 0 )) || say "phase throughput ended with status $prc (124: the time limit); rows kept"

# 6. the gpu-smoke benchmark (issue 18; benchmarks/fmnist_no_public.py is another
# change's): a GPU only, never with --tiny, only when its file exists and the budget left
# covers it. It writes its own results (benchmarks/results/); its log goes to the log.
if (( smoke_s > 0 )); then
  limit=$(( $(remaining) - 5 ))
  if (( limit >= 60 )); then
    say "gpu-smoke benchmark: ${limit}s left for it"
    brc=0
    marker="$(mktemp)"
    progress="$outdir/fmnist_no_public.progress.json"
    BENCH_SCALE=gpu-smoke BENCH_PROGRESS_FILE="$progress" run_limited "$limit" "$py" \
      -m benchmarks.fmnist_no_public || brc=$?
    (( brc == 0 )) || say "gpu-smoke benchmark ended with status $brc (124: the time limit)"
    # its results file lives in the repository copy: bring it out with the rest (it
    # replaces the progress file; a stopped run leaves the progress file)
    for f in benchmarks/results/fmnist_no_public.gpu.json benchmarks/results/fmnist_no_public.json; do
      if [[ -f "$f" && "$f" -nt "$marker" ]]; then cp "$f" "$outdir/" && rm -f "$progress"; fi
    done
    rm -f "$marker"
  else
    say "gpu-smoke benchmark skipped: ${limit}s left"
  fi
fi

say "done in $(( $(date +%s) - start_s ))s: $outdir/summary.json, $outdir/phase_throughput.json (engine rows status $rc, phases status $prc)"
if (( src == 0 && prc != 0 && prc != 124 )); then exit "$prc"; fi
exit "$src"
