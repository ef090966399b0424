"""Every ready-to-submit spec under examples/ validates against the job-spec schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dpsynth_shared.job_specs import JobSpec
from pydantic import TypeAdapter

EXAMPLES_DIR = Path(__file__).parents[3] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.rglob("*.yaml"))


def test_there_are_recipes_for_each_paper() -> None:
    names = {p.stem for p in EXAMPLES}
    for recipe in ("finetune-dp-ldms-attention", "finetune-dp-lora",
                   "finetune-dpdm-noise-multiplicity", "finetune-dp-docldm-per-label",
                   "generate-public-layouts"):
        assert recipe in names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_validates(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#"), "each example starts with a comment saying what it is"
    TypeAdapter(JobSpec).validate_python(yaml.safe_load(text))


def test_a_job_name_is_optional_free_text_without_control_characters() -> None:
    adapter: TypeAdapter = TypeAdapter(JobSpec)
    spec = yaml.safe_load((EXAMPLES_DIR / "quickstart" / "generate.yaml").read_text())
    assert adapter.validate_python(spec).name == "digits-synthetic"
    assert adapter.validate_python({**spec, "name": None}).name is None
    for bad in ("", "x" * 81, "two\nlines"):
        with pytest.raises(ValueError):
            adapter.validate_python({**spec, "name": bad})
