"""dpsynth's Python client: :class:`Client` over the REST api; errors are DpsynthError."""

from dpsynth_client.client import TERMINAL_STATES, Client
from dpsynth_client.errors import ApiError, NotConfigured

__all__ = ["TERMINAL_STATES", "ApiError", "Client", "NotConfigured"]
