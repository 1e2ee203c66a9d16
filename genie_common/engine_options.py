"""The options an engine is built with: one record from the flag or genie.toml key to the engine.

The daemon's configuration is an EngineOptions with the daemon's own fields beside (config.py), its worker is
handed the record whole (child_config.WorkerPart.engine), `genie` builds one from its flags (workers/cli.py) and
Engine takes it. Each field has one name everywhere: the TOML key and GENIE_<NAME> variable are the name, the
flag is --name-with-dashes. (The Home Assistant add-on's options are a schema of their own, which
genie_daemon/addon_options.py writes into genie.toml: its `context` is ctx.)
"""

from __future__ import annotations

from dataclasses import dataclass

from genie_common import defaults


@dataclass(frozen=True)
class EngineOptions:
    model: str = defaults.MODEL  # GGUF path, installed model name or a model of models_dir
    backend: str = "auto"  # auto | numpy | cupy
    ctx: int = 0  # context length in tokens; 0 = auto: the training context if mem_budget_mb holds it, else the most
    mem_budget_mb: int = 0  # memory the model, its KV cache and a step may take; 0 = what is free, less a tenth
    fp16_kv: bool = False  # FP16 KV cache instead of INT8 (per-position, per-head scales)
    prefill_chunk: int = defaults.PREFILL_CHUNK  # prompt tokens per forward pass; cancel is checked between chunks
    parallel: int = 0  # requests run at once, each in a KV slot of its own; 0 = the backend's default

    def __post_init__(self) -> None:
        if self.ctx < 0 or self.prefill_chunk < 1:
            raise ValueError("ctx must be >= 0 (0: auto), prefill_chunk >= 1")
        if self.parallel < 0:
            raise ValueError("parallel must be >= 0 (0: the backend's default)")
        if self.mem_budget_mb < 0:
            raise ValueError("mem_budget_mb must be >= 0 (0: what is free at start, less a tenth)")
