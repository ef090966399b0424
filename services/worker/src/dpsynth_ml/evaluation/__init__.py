"""Evaluation of synthetic corpora (docs/evaluation.md): the dpsynth feature network,
Fréchet distance, precision/recall/density/coverage, memorisation, downstream classifiers
and the orchestration of an evaluate job's metrics.

The feature-space Fréchet distance computed here is ``fd_dpsynth``, never FID: Inception FID
is computed only by :mod:`dpsynth_ml.evaluation.inception` with the pinned weights file.
"""

from dpsynth_ml.evaluation.classifiers import (
    CLASSIFIER_SETTINGS,
    Classifier,
    classifier_accuracy,
    per_class_recall,
    predict,
    train_classifier,
)
from dpsynth_ml.evaluation.corpus import EvaluationResult, evaluate_corpus, resize_uint8
from dpsynth_ml.evaluation.errors import FeatureNetworkRejected, InceptionWeightsUnavailable
from dpsynth_ml.evaluation.featnet import (
    FEATURE_ARCHITECTURE,
    FeatureNet,
    FeatureNetInfo,
    accuracy_threshold,
    check_feature_net,
    extract_features,
    feature_net_accuracy,
    load_feature_net,
    train_feature_net,
)
from dpsynth_ml.evaluation.metrics import (
    MEMORISATION_RATIO,
    MemorisationResult,
    frechet_distance,
    frechet_distance_gaussians,
    memorisation,
    prdc,
)

__all__ = [
    "CLASSIFIER_SETTINGS",
    "FEATURE_ARCHITECTURE",
    "MEMORISATION_RATIO",
    "Classifier",
    "EvaluationResult",
    "FeatureNet",
    "FeatureNetInfo",
    "FeatureNetworkRejected",
    "InceptionWeightsUnavailable",
    "MemorisationResult",
    "accuracy_threshold",
    "check_feature_net",
    "classifier_accuracy",
    "evaluate_corpus",
    "extract_features",
    "feature_net_accuracy",
    "frechet_distance",
    "frechet_distance_gaussians",
    "load_feature_net",
    "memorisation",
    "per_class_recall",
    "prdc",
    "predict",
    "resize_uint8",
    "train_classifier",
    "train_feature_net",
]
