"""pytorch-fid's own FID pipeline on two image folders, with a given state dict instead of
the downloaded weights; run by test_inception_reference.py in a separate process.

Usage: python pytorch_fid_reference.py STATE_DICT.pt DIR_A DIR_B OUT.npz

Run with torchvision 0.28.0 and pytorch-fid 0.3.0 on PYTHONPATH (installed with --no-deps
into a folder of their own). PyPI's torchvision 0.28.0 for Linux is a CUDA build: its C
extension does not load next to the CPU torch of this project, and ``import torchvision``
then fails in ``torchvision/_meta_registrations.py`` ("operator torchvision::nms does not
exist"). Neither Inception3 nor pytorch-fid needs those operators, so this script registers
``torchvision`` as a bare package (its ``__init__`` not run) and imports the submodules that
pytorch-fid uses. That is also why it runs in its own process: the test process's
``torchvision`` stays untouched.

Writes OUT.npz with pytorch-fid's pool features of each folder (``features_a``,
``features_b``: what its ``get_activations`` returned inside ``calculate_fid_given_paths``),
its FID of the two folders (``fid``), and the names and shapes of its network's state dict
(``keys``, ``shapes``, in order).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch


def _import_torchvision_without_extension() -> types.ModuleType:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("torchvision is not on the path")
    package = types.ModuleType("torchvision")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    sys.modules["torchvision"] = package
    from torchvision.version import __version__

    package.__version__ = __version__  # type: ignore[attr-defined]  # read by pytorch-fid
    return package


def main(state_path: Path, dir_a: Path, dir_b: Path, out: Path) -> None:
    torch.set_num_threads(1)
    _import_torchvision_without_extension()
    # only now that the bare torchvision package is registered
    import pytorch_fid.fid_score as fid_score
    import pytorch_fid.inception as fid_inception

    state = torch.load(state_path, map_location="cpu", weights_only=True)

    def from_url(url: str, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        # fid_inception_v3 builds torchvision's Inception3, swaps in its FID blocks and then
        # load_state_dict(strict=True)s what this returns in place of the downloaded file
        assert url == fid_inception.FID_WEIGHTS_URL, url
        return state

    fid_inception.load_state_dict_from_url = from_url

    recorded: list[np.ndarray] = []
    get_activations = fid_score.get_activations

    def recording(*args: object, **kwargs: object) -> np.ndarray:
        act: np.ndarray = get_activations(*args, **kwargs)  # type: ignore[arg-type]
        recorded.append(act)
        return act

    fid_score.get_activations = recording
    # pytorch-fid's command line with --device cpu --num-workers 0 (one process)
    fid = fid_score.calculate_fid_given_paths([str(dir_a), str(dir_b)], batch_size=50,
                                              device="cpu", dims=2048, num_workers=0)
    network = fid_inception.fid_inception_v3()
    layout = network.state_dict()
    np.savez(out, features_a=recorded[0], features_b=recorded[1], fid=np.float64(fid),
             keys=np.array(list(layout)),
             shapes=np.array([str(tuple(v.shape)) for v in layout.values()]))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    main(*(Path(a) for a in sys.argv[1:]))
