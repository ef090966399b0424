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
# opacus, and importlib_metadata, which diffusers imports. Versions: diffusers and opacus as
# pinned in requirements/constraints.txt; importlib_metadata 8.7 (its 10.x needs
# lazy-importer, which the image lacks too). All three are pure-Python wheels, ~5 MB in all.
# device_check.sh installs whatever is in .whl/ into a scratch folder on the machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pin() { grep -E "^$1==" requirements/constraints.txt | head -1; }
wanted=("$(pin diffusers)" "$(pin opacus)" "importlib_metadata==8.7.0")
for w in "${wanted[@]}"; do [[ "$w" == *==* ]] || { echo "no pin for: $w" >&2; exit 1; }; done
if [[ -d .git ]] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
  echo '/.whl/' >> .git/info/exclude
fi
mkdir -p .whl
py="$root/.venv/bin/python"; [[ -x "$py" ]] || py="$(command -v python3)"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${wanted[@]}"
ls -l .whl
