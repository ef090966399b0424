"""Contracts shared by every dpsynth service.

This package imports no torch, FastAPI or Celery: it holds ids, versioned job-spec and
DP-event schemas, error codes, the job state table, settings blocks, the read-grant token
format and the object-store port with its adapters.
"""

__version__ = "0.1.0"
