"""dpsynth_ml: the ML core of dpsynth (DP fine-tuning of latent diffusion models).

It takes local paths, a typed spec and hooks, and returns a typed result; it knows nothing
of Celery, HTTP, SQL or object stores, and opacus is imported only in ``dpsynth_ml.dp``.
``__all__`` below is the whole surface the worker and the benchmarks use (an import
contract holds the worker to it); docs/ml-core.md describes each name.
"""

from dpsynth_ml.audit.blackbox import BlackBoxAudit, black_box_audit_finetune
from dpsynth_ml.audit.dp_train import audit_dp_train
from dpsynth_ml.audit.finetune import audit_finetune
from dpsynth_ml.audit.ranks import audit_devices, audit_on_ranks, audit_placed
from dpsynth_ml.audit.whitebox import WhiteBoxAudit
from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.dp_train import ClassifierTraining, dp_train_classifier, load_classifier
from dpsynth_ml.evaluation import (
    Classifier,
    EvaluationResult,
    FeatureNet,
    FeatureNetInfo,
    check_feature_net,
    evaluate_corpus,
    load_feature_net,
    train_feature_net,
)
from dpsynth_ml.evaluation.dp import holdout_correct_counts, release_accuracies
from dpsynth_ml.models.initial import initial_model
from dpsynth_ml.models.model_io import model_hash, read_model_info
from dpsynth_ml.parallel.placement import train_placed
from dpsynth_ml.sampling.generate import (
    LayoutSet,
    is_layout_generator,
    load_layouts,
    sample,
    sample_layouts,
)
from dpsynth_ml.spec import (
    Architecture,
    CentralImages,
    DpSpec,
    FinetuneTraining,
    InvalidSpecError,
    MlError,
    ModelInfo,
    PerLabel,
    PretrainTraining,
    RecordLevel,
    SampleResult,
    SubjectLevel,
    TrainingResult,
    TrainingSpec,
)
from dpsynth_ml.training.entry import check_training, train
from dpsynth_ml.training.hooks import NullHooks, TrainingHooks

__all__ = [
    "Architecture",
    "BlackBoxAudit",
    "CentralImages",
    "Classifier",
    "ClassifierTraining",
    "DpSpec",
    "EvaluationResult",
    "FeatureNet",
    "FeatureNetInfo",
    "FinetuneTraining",
    "ImageDataset",
    "InvalidSpecError",
    "LayoutSet",
    "MlError",
    "ModelInfo",
    "NullHooks",
    "PerLabel",
    "PretrainTraining",
    "RecordLevel",
    "SampleResult",
    "SubjectLevel",
    "TrainingHooks",
    "TrainingResult",
    "TrainingSpec",
    "WhiteBoxAudit",
    "audit_devices",
    "audit_dp_train",
    "audit_finetune",
    "audit_on_ranks",
    "audit_placed",
    "black_box_audit_finetune",
    "check_feature_net",
    "check_training",
    "dp_train_classifier",
    "evaluate_corpus",
    "holdout_correct_counts",
    "initial_model",
    "is_layout_generator",
    "load_classifier",
    "load_dataset",
    "load_feature_net",
    "load_layouts",
    "model_hash",
    "read_model_info",
    "release_accuracies",
    "sample",
    "sample_layouts",
    "train",
    "train_feature_net",
    "train_placed",
]
