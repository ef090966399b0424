"""dpsynth's Python client: :class:`Client` over the REST api; errors are DpsynthError.

``Client.from_env()`` finds the api as the ``dpsynth`` CLI does (options, environment, the
platform's ``credentials.json``: :mod:`dpsynth_client.config`); ``submit_and_wait`` runs a
job to its end; ``download_corpus`` returns a synthetic corpus as numpy arrays.
"""

from dpsynth_client.client import TERMINAL_STATES, Client
from dpsynth_client.config import ClientConfig, resolve_config
from dpsynth_client.corpus import Corpus, CorpusError, read_corpus
from dpsynth_client.errors import ApiError, JobFailed, NotConfigured

__all__ = ["TERMINAL_STATES", "ApiError", "Client", "ClientConfig", "Corpus", "CorpusError",
           "JobFailed", "NotConfigured", "read_corpus", "resolve_config"]
