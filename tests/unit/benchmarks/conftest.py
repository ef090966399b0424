"""The ML-core fixtures (tiny digits dataset, tiny pretrained model) for the benchmarks'
own code (the non-private finetune)."""

from tests.unit.ml.conftest import digits_path, pretrained

__all__ = ["digits_path", "pretrained"]
