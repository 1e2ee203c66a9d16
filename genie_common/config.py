"""The daemon's one typed config: defaults, then the TOML file, then GENIE_* variables, then flags.

Environment variables are read in genie_common/env.py (GENIE_<OPTION> through env.option), but for
XDG_RUNTIME_DIR: the default socket directory is protocol/endpoints.py's, which clients given no endpoint
share.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from genie_common import defaults, env
from genie_common.child_config import StorePart, WorkerPart, to_arg
from genie_common.engine_options import EngineOptions
from genie_common.models.paths import default_models_dir
from genie_protocol.endpoints import client_endpoint, default_socket_dir


def _cache_dir() -> Path:
    return env.cache_home() / "genie" / "kv"


# the KV store's defaults, which its own command line (kvstore/__main__.py) and StoreConfig take from here
KV_CACHE_MAX_MB = 1024  # size cap of the saved KV
KV_CACHE_STALE_TMP_S = 60.0  # a temp file older than this is a crashed writer's


@dataclass(frozen=True)
class DaemonConfig(EngineOptions):
    """The daemon's configuration: the engine's options (engine_options.py, handed to the worker whole) and the
    daemon's own below."""

    models_dir: str = field(default_factory=lambda: str(default_models_dir()))  # pulled models (genie-ctl pull)
    auto_pull: bool = False  # at start, pull `model` into models_dir when it is not there (the add-on sets it)
    thermal_sensor: str = ""  # a file of millidegrees C the worker watches; empty: NVML on a GPU, else thermal zones
    thermal_throttle_c: float = 80.0  # above this the worker slows down (a pause between steps, one stream) ...
    thermal_resume_c: float = 70.0  # ... until the sensor reads this or less
    max_tokens_default: int = defaults.MAX_TOKENS  # an answer's token cap when a request sets none
    stream_interval_ms: float = 5.0  # a request's DELTAs at most this often (first token, sentence ends at once)
    socket_dir: str = field(default_factory=lambda: str(default_socket_dir()))  # where the ipc:// sockets live
    # a group whose members may use the client socket: socket_dir 0750 and genie.sock 0660 of that group;
    # empty: the daemon's user only (socket_dir 0700, every socket 0600)
    socket_group: str = ""
    client_endpoint: str = ""  # client socket; default ipc://<socket_dir>/genie.sock
    worker_endpoint: str = ""  # daemon <-> worker socket; default ipc://<socket_dir>/worker.sock
    admin_endpoint: str = ""  # genie-ctl's socket (mode 0600 when ipc); default ipc://<socket_dir>/admin.sock
    kv_store: bool = True  # run the KV-store process: conversations' KV saved at turn end, hydrated at turn start
    kv_endpoint: str = ""  # worker/daemon <-> KV store; default ipc://<socket_dir>/kv.sock
    kv_cache_dir: str = field(default_factory=lambda: str(_cache_dir()))  # where saved KV lives
    kv_cache_max_mb: int = KV_CACHE_MAX_MB  # size cap of the saved KV, least recently used evicted first; 0 = none
    kv_cache_stale_tmp_s: float = KV_CACHE_STALE_TMP_S  # temp files of a crashed save older than this are removed
    kv_store_timeout_s: float = 15.0  # a KV store that answers nothing this long is killed and restarted
    max_queue: int = 16  # requests waiting beyond those in flight (parallel); more are refused as "overloaded"
    heartbeat_timeout_s: float = 3.0  # a worker silent this long is dead (three missed 1 s beats)
    restart_backoff_s: float = 0.5  # first restart delay; doubles up to restart_backoff_max_s
    restart_backoff_max_s: float = 10.0
    drain_timeout_s: float = 0.0  # on SIGTERM, how long a running turn may go on before it is cancelled
    http: bool = True  # serve the Ollama- and OpenAI-compatible HTTP API (Home Assistant's way in)
    http_host: str = "127.0.0.1"  # bind address of the HTTP API; 0.0.0.0 to reach it from the network
    http_port: int = 11434  # Ollama's port, where Home Assistant looks first
    api_key: str = ""  # when set, HTTP clients must send "Authorization: Bearer <api_key>"
    http_max_body_mb: float = 8.0  # larger request bodies are refused (413)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_queue < 0 or not self.stream_interval_ms >= 0:
            raise ValueError("max_queue and stream_interval_ms must be >= 0")
        if not self.thermal_resume_c < self.thermal_throttle_c:
            raise ValueError("thermal_resume_c must be below thermal_throttle_c")
        if self.max_tokens_default < 1:
            raise ValueError("max_tokens_default must be >= 1: a request that asks for no limit must still end")
        if self.kv_cache_max_mb < 0 or not self.kv_cache_stale_tmp_s >= 0:
            raise ValueError("kv_cache_max_mb and kv_cache_stale_tmp_s must be >= 0")
        if not self.kv_store_timeout_s > 0:
            raise ValueError("kv_store_timeout_s must be > 0")
        if not self.http_host.strip():  # aiohttp binds every interface for "": never by an empty variable
            raise ValueError("http_host must not be empty: name the address to bind (0.0.0.0 for every interface)")
        if not 0 <= self.http_port <= 65535 or not self.http_max_body_mb > 0:
            raise ValueError("http_port must be in 0..65535 (0: any free port) and http_max_body_mb > 0")
        if not self.client_endpoint:
            object.__setattr__(self, "client_endpoint", client_endpoint(self.socket_dir))
        if not self.worker_endpoint:
            object.__setattr__(self, "worker_endpoint", f"ipc://{self.socket_dir}/worker.sock")
        if not self.admin_endpoint:
            object.__setattr__(self, "admin_endpoint", f"ipc://{self.socket_dir}/admin.sock")
        if not self.kv_endpoint:
            object.__setattr__(self, "kv_endpoint", f"ipc://{self.socket_dir}/kv.sock")

    def worker_part(self) -> WorkerPart:
        return WorkerPart(
            endpoint=self.worker_endpoint,
            engine=EngineOptions(**{f.name: getattr(self, f.name) for f in fields(EngineOptions)}),
            models_dir=self.models_dir,
            stream_interval_ms=self.stream_interval_ms,
            kv_endpoint=self.kv_endpoint if self.kv_store else "",
            thermal_sensor=self.thermal_sensor,
            thermal_throttle_c=self.thermal_throttle_c,
            thermal_resume_c=self.thermal_resume_c,
        )

    def store_part(self) -> StorePart:
        return StorePart(self.kv_endpoint, self.kv_cache_dir, self.kv_cache_max_mb, self.kv_cache_stale_tmp_s)

    def worker_args(self) -> list[str]:
        """`python -m genie_workers.worker`'s arguments: its part, serialized (child_config.py)."""
        return ["--part", to_arg(self.worker_part())]

    def kv_store_args(self) -> list[str]:
        """`python -m genie_kvstore`'s arguments: its part, serialized (child_config.py)."""
        return ["--part", to_arg(self.store_part())]


def default_config_path() -> Path:
    user = env.config_home() / "genie" / "genie.toml"
    return user if user.exists() else Path("/etc/genie/genie.toml")


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> DaemonConfig:
    """Defaults < TOML file < GENIE_<NAME> environment variables < `overrides` (flags)."""
    values: dict[str, Any] = {}
    types = {f.name: f.type for f in fields(DaemonConfig)}
    path = path or default_config_path()
    if path.exists():
        with open(path, "rb") as f:
            data = tomllib.load(f)
        unknown = set(data) - set(types)
        if unknown:
            raise ValueError(f"{path}: unknown option(s) {', '.join(sorted(unknown))}")
        values.update({name: _typed(value, str(types[name]), f"{path}: {name}") for name, value in data.items()})
    for name, kind in types.items():
        raw = env.option(name)
        if raw is not None:
            values[name] = _parse(raw, str(kind), f"GENIE_{name.upper()}")
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return DaemonConfig(**values)


def _typed(value: Any, kind: str, name: str) -> Any:
    """A TOML value of the field's type: `parallel = 2.5` or `ctx = "4096"` is an error naming the option
    here, not a comparison that fails in __post_init__ or an argument the worker refuses."""
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # `stream_interval_ms = 5` means 5.0
    if type(value).__name__ != kind:  # exact: true is no int, 1.0 no int
        raise ValueError(f"{name} = {value!r} is not a valid {kind}")
    return value


def _parse(raw: str, kind: str, name: str) -> Any:
    try:
        if kind == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind}") from None
