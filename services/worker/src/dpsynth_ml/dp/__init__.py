"""Differential privacy mechanics; the only subpackage of the ML core that imports opacus."""

from dpsynth_ml.dp.engine import DpSgdEngine
from dpsynth_ml.dp.sampler import PoissonSampler, SubjectBatch, SubjectPoissonSampler

__all__ = ["DpSgdEngine", "PoissonSampler", "SubjectBatch", "SubjectPoissonSampler"]
