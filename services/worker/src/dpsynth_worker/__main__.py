"""``python -m dpsynth_worker``: a Celery worker, one job at a time, on queue ``dpsynth``.

Reads the settings once, configures JSON logs, optionally serves Prometheus metrics on
``METRICS_PORT``, builds the ports and starts Celery's solo pool (the task runs in the main
process, so SIGTERM reaches the running job and it stops at a step boundary).
"""

from __future__ import annotations

import sys

from dpsynth_shared.logging import configure_logging

from dpsynth_worker.celery_app import create_app
from dpsynth_worker.metrics import serve_metrics
from dpsynth_worker.runtime import build_runtime, install_runtime
from dpsynth_worker.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    """Start the worker (blocks until it shuts down)."""
    settings = load_settings()
    configure_logging("worker", settings.log_level)
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    if settings.metrics_port:
        serve_metrics(settings.metrics_port)
    install_runtime(build_runtime(settings))
    app = create_app(settings)
    app.worker_main(["--quiet", "worker", "--pool=solo", "--concurrency=1", "-Q", settings.queue,
                     "--loglevel", settings.log_level.upper(), "--without-gossip",
                     "--without-mingle", "-n", f"dpsynth@{settings.worker_id}",
                     *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    main()
