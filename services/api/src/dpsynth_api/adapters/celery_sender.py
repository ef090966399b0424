"""Sending ``dpsynth.run_job`` by name with Celery (the api never imports the worker)."""

from __future__ import annotations

from celery import Celery

from dpsynth_api.ports import TASK_NAME, TASK_QUEUE


class CelerySender:
    """:class:`dpsynth_api.ports.TaskSender` over a Redis broker.

    Args:
        broker_url: the Celery broker (``redis://...``).
    """

    def __init__(self, broker_url: str) -> None:
        self._app = Celery("dpsynth-api", broker=broker_url)
        self._app.conf.broker_connection_retry_on_startup = True
        self._app.conf.broker_transport_options = {"max_retries": 3}

    def send_run_job(self, job_id: str, attempt: int) -> None:
        """Queue one attempt of a job on queue ``dpsynth``."""
        self._app.send_task(TASK_NAME, args=[job_id, attempt], queue=TASK_QUEUE)

    def ping(self) -> bool:
        """True when the broker accepts a connection."""
        try:
            with self._app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
            return True
        except Exception:  # noqa: BLE001 - any broker error means "not ready"
            return False

    def close(self) -> None:
        """Release the broker connection pool."""
        self._app.close()
