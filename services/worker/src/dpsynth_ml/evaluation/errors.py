"""Errors of the evaluation library; each ``code`` is a stable string the services map to an
RFC 9457 problem (``dpsynth_shared.errors``)."""

from __future__ import annotations

from dpsynth_ml.spec import MlError


class FeatureNetworkRejected(MlError):
    """The feature network cannot be trusted as a feature space for this evaluation.

    Raised when its accuracy on public validation data is below the check's threshold (a
    randomly initialised or broken network), when its weights do not hash to the recorded
    sha256, or when its files are not a ``dpsynth-featnet-v1`` network.

    Attributes:
        accuracy: the re-measured accuracy, when the accuracy check failed.
        threshold: the threshold it had to reach, when the accuracy check failed.
    """

    code = "feature_network_rejected"

    def __init__(self, message: str, *, accuracy: float | None = None,
                 threshold: float | None = None) -> None:
        super().__init__(message)
        self.accuracy = accuracy
        self.threshold = threshold


class InceptionWeightsUnavailable(MlError):
    """The pytorch-fid InceptionV3 weights file is missing or is not the pinned file."""

    code = "inception_weights_unavailable"
