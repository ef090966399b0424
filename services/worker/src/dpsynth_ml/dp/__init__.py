"""Differential privacy mechanics; the only subpackage of the ML core that imports opacus."""

from dpsynth_ml.dp.bookkeeping import BookKeepingEngine, UnsupportedModuleError
from dpsynth_ml.dp.choice import EngineKind, choose_engine
from dpsynth_ml.dp.engine import DpSgdEngine
from dpsynth_ml.dp.sampler import PoissonSampler, SubjectBatch, SubjectPoissonSampler

__all__ = ["BookKeepingEngine", "DpSgdEngine", "EngineKind", "PoissonSampler", "SubjectBatch",
           "SubjectPoissonSampler", "UnsupportedModuleError", "choose_engine"]
