"""Direct DP training of downstream models (issue 20): ``dp_train`` jobs.

:mod:`~dpsynth_ml.dp_train.models` holds the classifiers DP-SGD suits;
:mod:`~dpsynth_ml.dp_train.spec` what a job runs; :mod:`~dpsynth_ml.dp_train.run` the
training (the DP finetune's mechanism with a classifier's loss) and the model folder.
"""

from dpsynth_ml.dp_train.models import ARCHITECTURES, DpClassifier, build_classifier
from dpsynth_ml.dp_train.run import dp_train_classifier, load_classifier, save_classifier
from dpsynth_ml.dp_train.spec import ClassifierTraining

__all__ = ["ARCHITECTURES", "ClassifierTraining", "DpClassifier", "build_classifier",
           "dp_train_classifier", "load_classifier", "save_classifier"]
