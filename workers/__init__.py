"""genie's GPU worker process and the inference engine it owns."""

from genie_common import __version__

__all__ = ["__version__"]
