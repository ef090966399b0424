"""The evaluation report's JSON document (``report.json``), validated before it is stored."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from dpsynth_shared.evaluation import EvaluationReport


def plain(value: Any) -> Any:
    """``value`` as JSON-ready Python: numpy scalars/arrays unwrapped, NaN/inf as None
    (strict JSON has no NaN; a metric that could not be computed is null)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def validate(document: Mapping[str, Any]) -> EvaluationReport:
    """Check the document against :class:`EvaluationReport` (pydantic ValidationError)."""
    return EvaluationReport.model_validate(plain(document))


def render_json(document: Mapping[str, Any]) -> bytes:
    """``report.json``: the validated document, indented, UTF-8, strict JSON."""
    report = validate(document)
    data = plain(report.model_dump(mode="json"))
    return (json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
