"""The daemon's models directory (config.models_dir): what it lists and finds (model_catalog.py), pulls
(pull_relay.py) and deletes, for the HTTP fronts.

Every pull runs in a thread of its own and is cancelled when whoever asked goes away: an HTTP client that
disconnects, the daemon's stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from pathlib import Path

from workers.models.local import LocalModel, ModelsDir
from workers.models.pull import PullProgress

from .model_catalog import ModelCatalog, listing
from .model_info import ModelInfo
from .pull_relay import PullRelay

log = logging.getLogger("genie.daemon")


class ModelStore:
    def __init__(self, models_dir: str) -> None:
        self.models = ModelsDir(Path(models_dir))
        self.catalog = ModelCatalog(self.models)
        self._relays: set[PullRelay] = set()

    # -- the HTTP fronts ----------------------------------------------------------------------------------
    async def list_models(self, fixed: list[ModelInfo]) -> list[ModelInfo]:
        """`fixed` (the served and the configured model) and every model of the models directory (/api/tags,
        /v1/models)."""
        return listing(fixed, await asyncio.to_thread(self.catalog.local))

    async def find_model(self, fixed: list[ModelInfo], name: str) -> ModelInfo | None:
        """The model a request's `model` addresses: one of `fixed` first, else one of the models directory
        (where a fixed one of the models directory is looked up too: deleted while unloaded, it is gone)."""
        for info in fixed:
            if info.is_named(name) and not info.local:
                return info
        return await asyncio.to_thread(self.catalog.find_local, name)

    async def delete(self, info: ModelInfo) -> bool:
        """Removes a model of the models directory; False when it was not there."""
        return await asyncio.to_thread(self.models.remove, info.configured)

    async def pull(
        self, source: str, keepalive_s: float | None = None, name: str | None = None
    ) -> AsyncGenerator[PullProgress | LocalModel, None]:
        """Pulls `source` into the models directory: its progress, then the model added; PullError when it
        fails. Leaving the iteration cancels the pull."""
        relay = PullRelay(source, self.models, name)
        self._relays.add(relay)
        try:
            async for ev in relay.events(keepalive_s):
                yield ev
        finally:
            self._relays.discard(relay)

    def stop(self) -> None:
        """The daemon stops: every pull ends (its thread at its next chunk; a later pull resumes it)."""
        for relay in self._relays:
            relay.cancel()
