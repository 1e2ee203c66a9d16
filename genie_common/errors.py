"""Typed errors for everything that comes from outside the engine (files, requests).

`assert` is kept for internal invariants only; these survive `python -O`.
"""

from __future__ import annotations

from pathlib import Path


class GenieError(Exception):
    """Base class of every error genie reports to a user as one line."""


class ModelFileError(GenieError):
    """A model file is missing, truncated, corrupt, foreign or uses something genie cannot run."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class BackendUnsupportedError(ModelFileError):
    """A valid model file that the chosen backend cannot run (the `auto` backend then falls back to NumPy)."""


class RequestError(GenieError):
    """A request is malformed or impossible (bad sampling value, prompt longer than the context)."""


class ModelError(GenieError):
    """The model computed something unusable (non-finite logits): its weights are corrupt or it overflowed."""


class ModelNotFoundError(GenieError):
    """`-m` names neither an existing file nor an installed model package."""


class PullError(GenieError):
    """A model could not be fetched or added to the models directory (network, bad file, wrong digest)."""
