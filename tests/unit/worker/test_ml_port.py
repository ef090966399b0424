"""The worker's ML port: the adapter binds every call of the port, through the core's face
only, and the worker imports neither torch nor the core until an ML call runs."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import dpsynth_ml
from dpsynth_worker import ml_adapter
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.ml_port import MlPort

_SETTINGS = ("inception_weights", "devices")


def _calls() -> list[str]:
    return [name for name, member in inspect.getmembers(MlPort, inspect.isfunction)
            if not name.startswith("_")]


def test_importing_the_worker_imports_neither_torch_nor_the_core() -> None:
    code = ("import sys\n"
            "import dpsynth_worker.__main__, dpsynth_worker.celery_app, dpsynth_worker.runners\n"
            "loaded = {'torch', 'dpsynth_ml', 'opacus', 'diffusers'} & set(sys.modules)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_adapter_implements_every_call_of_the_port_with_its_signature() -> None:
    assert len(_calls()) == 21
    for name in _calls():
        port, bound = inspect.signature(getattr(MlPort, name)), \
            inspect.signature(getattr(MlAdapter, name))
        assert [(p.name, p.kind, p.default) for p in bound.parameters.values()] == \
            [(p.name, p.kind, p.default) for p in port.parameters.values()], name
        assert bound.return_annotation == port.return_annotation, name
    core = MlAdapter(inception_weights=Path("w.pt"), devices="cuda:0")
    assert (core.inception_weights, core.devices) == (Path("w.pt"), "cuda:0")
    assert all(isinstance(getattr(MlPort, s), property) for s in _SETTINGS)


def test_the_adapter_reaches_the_core_only_through_its_face() -> None:
    tree = ast.parse(Path(ml_adapter.__file__).read_text())
    imported = {(node.module if isinstance(node, ast.ImportFrom) else alias.name)
                for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names}
    assert {m for m in imported if m and m.startswith("dpsynth_ml")} == {"dpsynth_ml"}
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "dpsynth_ml"}
    assert used and used <= set(dpsynth_ml.__all__)
