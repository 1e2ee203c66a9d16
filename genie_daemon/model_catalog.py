"""The models a request may name: the served one (config.model) and every model of the models directory,
as the HTTP APIs describe them (model_info.py). Naming another model than the served one loads it
(server.py, `Daemon.ensure_loaded`).

Each model's description is read from its GGUF header once and kept while its manifest says the same
file (size and sha256), so listing the directory costs a directory scan, not a header read per model.
Every method here touches the disk: the daemon calls them in a thread.
"""

from __future__ import annotations

import threading

from genie_common.models.local import LocalModel, ModelsDir

from .model_info import ModelInfo, describe_local

LATEST = ":latest"  # Ollama's default tag: `tiny2:latest` is `tiny2`


class ModelCatalog:
    def __init__(self, models: ModelsDir) -> None:
        self.models = models
        self._described: dict[str, tuple[LocalModel, ModelInfo]] = {}
        self._lock = threading.Lock()  # the HTTP fronts may list from several threads at once

    def local(self) -> list[ModelInfo]:
        """Every model of the models directory, by name."""
        return [self._describe(m) for m in self.models.list()]

    def find_local(self, name: str) -> ModelInfo | None:
        """The model of the models directory that `name` (with or without `:latest`) addresses."""
        m = self.models.get(name.removesuffix(LATEST))
        return self._describe(m) if m is not None else None

    def _describe(self, m: LocalModel) -> ModelInfo:
        with self._lock:
            known = self._described.get(m.name)
        if known is not None and known[0] == m:
            return known[1]
        info = describe_local(m)
        with self._lock:
            self._described[m.name] = (m, info)
        return info


def listing(fixed: list[ModelInfo], local: list[ModelInfo]) -> list[ModelInfo]:
    """/api/tags and /v1/models: the served model first (at once, also while it loads) and the configured
    one, then the models directory's, each name once. One of the models directory that is no longer there
    (deleted while unloaded) is not listed."""
    here = {m.name for m in local}
    first: list[ModelInfo] = []
    for info in fixed:
        if not any(f.name == info.name for f in first) and (not info.local or info.name in here):
            first.append(info)
    return first + [m for m in local if not any(f.is_named(m.name) for f in first)]
