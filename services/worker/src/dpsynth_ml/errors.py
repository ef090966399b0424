"""The ML core's errors: each has a stable ``code`` the services map to a problem."""

from __future__ import annotations


class MlError(Exception):
    """Base class of ML-core errors; ``code`` is a stable string the services map."""

    code: str = "ml_error"


class InvalidSpecError(MlError, ValueError):
    """The spec, dataset or model directory cannot be used as asked."""

    code = "invalid_spec"
