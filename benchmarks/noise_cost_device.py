"""The ChaCha20 noise source on a GPU (docs/benchmarks.md, "DP noise source").

Meant for a bare GPU machine (the device tool's image has torch, pytest and scipy but not
opacus or diffusers): runs tests/unit/ml/test_noise_source.py, its CUDA known-answer test
included, and times one draw of n float32 values (as the DP engine makes it once per logical
step) against ``torch.randn`` on the same device, mean of 5 draws after 2 warm-ups with
``torch.cuda.synchronize`` around the window. ``dpsynth_ml``'s package ``__init__`` imports
opacus, so ``dpsynth_ml`` and ``dpsynth_ml.dp`` are bound to their folders without running
it (``noise.py`` needs torch alone). Writes ``$OUT/noise_cost.gpu.json`` (else /tmp).

Run from the repository root: ``python3 benchmarks/noise_cost_device.py``.
"""
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

root = Path.cwd()
src = root / "services/worker/src/dpsynth_ml"
for name, path in (("dpsynth_ml", src), ("dpsynth_ml.dp", src / "dp")):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod
sys.path.insert(0, str(root))
out = Path(os.environ.get("OUT") or tempfile.gettempdir())
import pytest  # noqa: E402

rc = pytest.main(["-q", "-p", "no:cacheprovider", "--noconftest", "-o", "addopts=",
                  "-rs", str(root / "tests/unit/ml/test_noise_source.py")])
from dpsynth_ml.dp.noise import ChaChaGaussian  # noqa: E402

res = {"pytest_rc": int(rc), "torch": torch.__version__,
       "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


def timed(fn, sync, reps=5):
    for _ in range(2):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps


devs = [torch.device("cuda")] if torch.cuda.is_available() else []
devs.append(torch.device("cpu"))
for dev in devs:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for n in (1_000_000, 31_000_000):
        if dev.type == "cpu" and n > 1_000_000 and devs[0].type == "cuda":
            continue
        src_ = ChaChaGaussian.from_os_entropy()
        cha = timed(lambda s=src_, n=n, d=dev: s.gaussian((n,), 1.0, device=d,
                                                          dtype=torch.float32), sync)
        rnd = timed(lambda n=n, d=dev: torch.randn(n, device=d, dtype=torch.float32), sync)
        res[f"{dev.type}_{n}"] = {"chacha_s": cha, "randn_s": rnd,
                                  "chacha_draws_per_s": n / cha, "ratio": cha / rnd}
print(json.dumps(res, indent=1))
(out / "noise_cost.gpu.json").write_text(json.dumps(res, indent=1))
sys.exit(rc)
