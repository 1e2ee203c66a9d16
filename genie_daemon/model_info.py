"""What the HTTP APIs say about a model (Ollama's /api/tags and /api/show, OpenAI's /v1/models): the served
one and those of the models directory, read from the GGUF file's header by the daemon itself, so it can
answer while the worker still loads.

Reading a header is cheap (the tensor data is never touched) and runs in a thread; a packaged model that
has not been assembled yet (first start) is described from the registry until the file exists. A model of
the models directory is named by its name there and its digest is its file's sha256 (its manifest's);
for any other the digest is the GGUF fingerprint, which needs no pass over the whole file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from genie_common.capabilities import capabilities_of
from genie_common.errors import GenieError
from genie_common.gguf_file import GGUFFile
from genie_common.models.local import LocalModel, ModelsDir
from genie_common.registry import MODELS, installed_path


def client_name(model: str) -> str:
    """How clients see `model` (config.model): an installed model by its name, a GGUF path by its file's
    stem, as Ollama names models (a path in /api/tags and every reply was long and leaked the layout)."""
    if model in MODELS:
        return model
    name = Path(model).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


@dataclass(frozen=True)
class ModelInfo:
    name: str  # as clients see it: client_name(config.model)
    size: int  # file bytes
    digest: str  # hex: the GGUF fingerprint (sha256 of its size, header and tensor table); "" when unknown
    family: str  # the GGUF architecture, e.g. qwen3, gemma3
    parameter_size: str  # e.g. "268.1M"
    quantization: str  # e.g. "Q4_K_M"
    modified_at: float  # the file's mtime (0 when unknown)
    context_length: int = 0
    chat_template: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)  # scalar general.* and <arch>.* keys
    configured: str = ""  # config.model as given (a path or an installed name): requests may name it too
    local: bool = False  # a model of the models directory (pulled): `configured` is its name there

    @classmethod
    def named(cls, model: str, size: int = 0) -> ModelInfo:
        """What is known of a model before its file is read: its name (and a packaged model's size)."""
        return cls(
            name=client_name(model),
            size=size,
            digest="",
            family="",
            parameter_size="",
            quantization="",
            modified_at=0.0,
            configured=model,
        )

    def is_named(self, name: str) -> bool:
        """Whether a request's `model` addresses this one: its name, with or without Ollama's `:latest`, or
        the path it was configured with."""
        return name in (self.name, f"{self.name}:latest") or (bool(self.configured) and name == self.configured)

    @cached_property
    def capabilities(self) -> tuple[str, ...]:
        """What the model can do, from its chat template (genie_common/capabilities.py): /api/show's list,
        and what the HTTP APIs refuse to ask of it (`lacks`)."""
        return capabilities_of(self.chat_template)

    def lacks(self, capability: str) -> bool:
        """Whether the model cannot do `capability`. Known once its header was read (its architecture is
        known): before that (a first start assembling the file) nothing is refused, and the worker renders
        what the template takes."""
        return bool(self.family) and capability not in self.capabilities


def known_at_once(model: str) -> ModelInfo:
    """What the daemon says of a model before its header is read in a thread (describe): its name and its
    size (a packaged model's, or the file's by one stat), so /api/tags never lists a model of 0 bytes."""
    packaged = MODELS.get(model)
    if packaged is not None:
        return ModelInfo.named(model, packaged.size_bytes)
    try:
        return ModelInfo.named(model, os.stat(model).st_size)
    except OSError:  # a name, or a file not there (yet): the thread's describe says more
        return ModelInfo.named(model)


def describe(model: str, models: ModelsDir) -> ModelInfo:
    """The served model (config.model) as the HTTP APIs report it; never raises for a missing or unreadable
    file. A model pulled into the models directory wins over a packaged one of the same name, as the
    worker reads it (genie_common/registry.py)."""
    local = models.get(model)
    if local is not None:
        return describe_local(local)
    path = installed_path(model)
    if path is not None:
        try:
            return _from_file(model, path)
        except (GenieError, OSError, ValueError):
            pass
    packaged = MODELS.get(model)
    return ModelInfo.named(model, packaged.size_bytes if packaged else 0)


def describe_local(m: LocalModel) -> ModelInfo:
    """A model of the models directory, from its file's header, with its manifest's sha256 as the digest;
    from the manifest alone when the header cannot be read."""
    try:
        info = _from_file(m.name, m.path)
    except (GenieError, OSError, ValueError):
        info = ModelInfo(m.name, m.size_bytes, "", m.architecture, "", m.quant, 0.0, m.context, configured=m.name)
    return replace(info, digest=m.sha256, quantization=m.quant, local=True)


def _from_file(model: str, path: Any) -> ModelInfo:
    with GGUFFile(path) as gf:
        arch = gf.architecture
        n_params = sum(_elements(t.shape) for t in gf.tensors.values())
        size_label = gf.get("general.size_label")
        file_type = gf.get("general.file_type")
        template = gf.get("tokenizer.chat_template")
        ctx = gf.get(f"{arch}.context_length")
        meta = {
            k: v
            for k, v in gf.metadata.items()
            if (k.startswith("general.") or k.startswith(f"{arch}.")) and isinstance(v, (str, int, float, bool))
        }
        meta["general.parameter_count"] = n_params
        return ModelInfo(
            name=client_name(model),
            size=gf.file_size,
            digest=gf.fingerprint().hex(),
            family=arch,
            parameter_size=size_label if isinstance(size_label, str) and size_label else _human(n_params),
            quantization=_quantization(file_type),
            modified_at=path.stat().st_mtime,
            context_length=int(ctx) if isinstance(ctx, int) else 0,
            chat_template=template if isinstance(template, str) else "",
            metadata=meta,
            configured=model,
        )


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _human(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _quantization(file_type: Any) -> str:
    try:
        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")  # F32, not ALL_F32
    except (TypeError, ValueError):
        return "unknown"


def iso_time(t: float | None = None) -> str:
    """RFC 3339 with nanosecond-style fraction and Z, as Ollama writes times."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e9):09d}Z"
