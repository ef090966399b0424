"""The embedded platform (``dpsynth up``): every service as a local process."""

from dpsynth_cli.embedded.platform import EmbeddedPlatform, PlatformState
from dpsynth_cli.embedded.processes import PlatformError
from dpsynth_cli.embedded.secrets import PlatformSecrets, load_or_create_secrets

__all__ = ["EmbeddedPlatform", "PlatformError", "PlatformSecrets", "PlatformState",
           "load_or_create_secrets"]
