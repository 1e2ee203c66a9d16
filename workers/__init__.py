"""genie's GPU worker process and the inference engine it owns."""

__version__ = "0.1.0"
