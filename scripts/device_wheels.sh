#!/usr/bin/env bash
# Wheels that scripts/device_check.sh needs and the GPU machine's image lacks, fetched HERE
# (the GPU machine reaches no package index) into .whl/ (git-ignored through
# .git/info/exclude), for the device tool to carry:
#
#   bash scripts/device_wheels.sh                    # here, once: fills .whl/
#   run(command="bash scripts/device_check.sh $OUT", carry=[".whl"])
#
# The image (Python 3.12, torch, peft, numpy, scipy, huggingface-hub, safetensors, pillow,
# regex, requests, opt-einsum, zipp; /work/.library/device/KINDS.md) lacks diffusers and
# opacus, importlib_metadata (which diffusers imports), and what the benchmarks' accounting
# imports (the ledger's PLD calibration: dp-accounting, pydantic with pydantic_core,
# annotated-types and typing-inspection). Versions: as pinned in requirements/constraints.txt;
# importlib_metadata 8.7 (its 10.x needs lazy-importer, which the image lacks too).
# pydantic_core is the only compiled one (cp312, manylinux); ~9 MB in all.
# device_check.sh installs whatever is in .whl/ into a scratch folder on the machine.
#
# It also copies Debian's Fashion-MNIST IDX files (/usr/share/datasets/fashion-mnist, ~30 MB;
# `apt-get install dataset-fashion-mnist` first) into .fmnist/ (git-ignored the same way), which
# device_check.sh points the gpu-smoke benchmark at: carry=[".whl", ".fmnist"].
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pin() { grep -E "^$1==" requirements/constraints.txt | head -1; }
wanted=("$(pin diffusers)" "$(pin opacus)" "importlib_metadata==8.7.0" "$(pin dp-accounting)"
        "$(pin pydantic)" "$(pin pydantic_core)" "$(pin annotated-types)"
        "$(pin typing-inspection)")
for w in "${wanted[@]}"; do [[ "$w" == *==* ]] || { echo "no pin for: $w" >&2; exit 1; }; done
for ignored in /.whl/ /.fmnist/; do
  if [[ -d .git ]] && ! grep -qx "$ignored" .git/info/exclude 2>/dev/null; then
    echo "$ignored" >> .git/info/exclude
  fi
done
mkdir -p .whl
py="$root/.venv/bin/python"; [[ -x "$py" ]] || py="$(command -v python3)"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${wanted[@]}"
ls -l .whl
fmnist="${DPSYNTH_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
if [[ -f "$fmnist/train-images-idx3-ubyte.gz" ]]; then
  mkdir -p .fmnist && cp "$fmnist"/*-ubyte.gz .fmnist/ && ls -l .fmnist
else
  echo "no Fashion-MNIST under $fmnist: the gpu-smoke benchmark will be skipped there" >&2
fi
