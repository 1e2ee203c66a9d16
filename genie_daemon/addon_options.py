"""The Home Assistant add-on's options (/data/options.json) as genie's TOML config.

The add-on's run.sh calls `python -m genie_daemon.addon_options /data/options.json /data/genie.toml` at
every start. It checks what HA's schema cannot (a model is a short name, an hf:// or http(s) source, or an
absolute .gguf path the container can see; the forward URL is plain http://HOST[:PORT]), writes the TOML
for `genie-daemon --config` in local mode, and prints the plan for run.sh on stdout: `local`, or
`forward HOST PORT`. Bad options exit 2 with one line naming the option. A model that is not there yet
(a catalogue name, a source) is pulled by the daemon on first start into /data/models (`auto_pull`).
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from genie_common.atomic_file import atomic_path

ADDON_PORT = 11434  # the port inside the container (config.yaml `ports`), Ollama's default
KV_CACHE_DIR = "/data/kv"  # on the add-on's persistent volume; config.yaml's backup_exclude skips it
MODELS_DIR = "/data/models"  # pulled models, kept across restarts; left out of backups (pulled again)
PULL_SCHEMES = ("hf://", "https://", "http://")  # sources the daemon pulls (genie_common/models/sources.py)
SOCKET_DIR = "/run/genie"
MODEL_DIRS = ("/share/", "/media/")  # the folders config.yaml maps in, where users can put a GGUF file
CTX_MIN, CTX_MAX = 256, 131072  # config.yaml's schema: int(256,131072)
DEFAULTS: dict[str, Any] = {  # config.yaml's `options`, plus the two optional (`?`) ones
    "mode": "local",
    "model": "gemma3-270m",
    "context": 4096,
    "kv_cache_mb": 1024,
    "fp16_kv": False,
    "parallel": 0,
    "api_key": "",
    "forward_url": "",
}
HEADER = "# Written from /data/options.json at every start of the add-on: change its options, not this file.\n"
OPTIONAL = ("api_key", "forward_url")  # HA leaves these out, or null, when they are empty
_SHORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOKEN = re.compile(r"[!-~]*")  # visible ASCII: the key travels in an `Authorization: Bearer` header
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?")


@dataclass(frozen=True)
class AddonOptions:
    mode: str  # local | forward
    model: str
    ctx: int
    kv_cache_max_mb: int
    fp16_kv: bool
    parallel: int  # requests served at once; 0: the worker's default
    api_key: str
    forward_host: str  # forward mode's target; "" in local mode
    forward_port: int


def parse_options(raw: object) -> AddonOptions:
    """Validated options; ValueError naming the first bad one."""
    if not isinstance(raw, dict):
        raise ValueError(f"options must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(map(str, unknown))}; known: {', '.join(DEFAULTS)}")
    given = {k: v for k, v in raw.items() if not (k in OPTIONAL and v is None)}
    o = DEFAULTS | given
    mode = _typed(o, "mode", str)
    if mode not in ("local", "forward"):
        raise ValueError(f"mode must be 'local' or 'forward', not {mode!r}")
    ctx = _typed(o, "context", int)
    if not CTX_MIN <= ctx <= CTX_MAX:
        raise ValueError(f"context must be between {CTX_MIN} and {CTX_MAX} tokens, not {ctx}")
    kv_mb = _typed(o, "kv_cache_mb", int)
    if kv_mb < 0:
        raise ValueError(f"kv_cache_mb must be >= 0 (0 = no cap), not {kv_mb}")
    parallel = _typed(o, "parallel", int)
    if parallel < 0:
        raise ValueError(f"parallel must be >= 0 (0 = genie's default), not {parallel}")
    api_key = _typed(o, "api_key", str)
    if not _TOKEN.fullmatch(api_key):
        raise ValueError("api_key may hold only visible ASCII characters (no spaces)")
    url = _typed(o, "forward_url", str)
    host, port = _forward_target(url) if mode == "forward" else ("", 0)  # local mode ignores it
    return AddonOptions(
        mode=mode,
        model=_model(_typed(o, "model", str)),
        ctx=ctx,
        kv_cache_max_mb=kv_mb,
        fp16_kv=_typed(o, "fp16_kv", bool),
        parallel=parallel,
        api_key=api_key,
        forward_host=host,
        forward_port=port,
    )


def daemon_values(opts: AddonOptions) -> dict[str, Any]:
    """The DaemonConfig fields the add-on sets; everything else keeps genie's defaults."""
    return {
        "model": opts.model,
        "ctx": opts.ctx,
        "fp16_kv": opts.fp16_kv,
        "parallel": opts.parallel,
        "kv_cache_dir": KV_CACHE_DIR,
        "models_dir": MODELS_DIR,
        "auto_pull": True,  # the model option names what to serve; the first start fetches it
        "kv_cache_max_mb": opts.kv_cache_max_mb,
        "socket_dir": SOCKET_DIR,
        "http": True,
        "http_host": "0.0.0.0",  # inside the container; HA publishes the port per config.yaml
        "http_port": ADDON_PORT,
        "api_key": opts.api_key,
    }


def render_toml(opts: AddonOptions) -> str:
    values = daemon_values(opts)
    return HEADER + "".join(f"{key} = {toml_value(value)}\n" for key, value in values.items())


def toml_value(value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_string(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped, so any text round-trips."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r} is not valid Unicode (a lone surrogate)")
        else:
            out.append(ch)
    return "".join(out) + '"'


_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false"}


def _typed(options: dict[str, Any], name: str, kind: type) -> Any:
    value = options[name]
    if type(value) is not kind:  # exact: JSON true is not a number, 1.0 is not an int
        raise ValueError(f"{name} must be {_KIND_NAMES[kind]}, not {type(value).__name__} {value!r}")
    return value


def _model(model: str) -> str:
    if _SHORT_NAME.fullmatch(model):
        return model  # installed, pulled or in the catalogue: the daemon pulls it or says which exist
    if model.startswith(PULL_SCHEMES) and model.isprintable() and " " not in model:
        return model  # pulled by the daemon on first start, then served under its file's name
    if model.startswith("/") and model.endswith(".gguf") and model.isprintable():
        if model.startswith(MODEL_DIRS) and "/../" not in model:
            return model
        raise ValueError(f"model {model!r}: the add-on sees files only under {', '.join(MODEL_DIRS)}")
    raise ValueError(
        f"model must be a short name like 'qwen3-0.6b', an hf:// or http(s):// source, or an absolute path to a"
        f" .gguf file, not {model!r}"
    )


def _forward_target(url: str) -> tuple[str, int]:
    if not url:
        raise ValueError("mode 'forward' needs forward_url: the http://HOST:11434 of the genie to forward to")
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"forward_url must look like http://HOST:11434 (plain HTTP, no path), not {url!r}")
    try:
        port = ADDON_PORT if parts.port is None else parts.port
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ValueError(f"forward_url {url!r}: the port must be a number from 1 to 65535")
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"forward_url {url!r}: {host!r} is not a host name or IP address") from None
    return host, port


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m genie_daemon.addon_options OPTIONS_JSON GENIE_TOML", file=sys.stderr)
        return 2
    try:
        opts = parse_options(json.loads(Path(args[0]).read_text(encoding="utf-8")))
        if opts.mode == "forward":
            print(
                f"genie add-on: forwarding port {ADDON_PORT} to {opts.forward_host}:{opts.forward_port}",
                file=sys.stderr,
            )
            print(f"forward {opts.forward_host} {opts.forward_port}")
            return 0
        with atomic_path(Path(args[1]), mode=0o600) as tmp:  # 0600: it may hold the API key
            tmp.write_text(render_toml(opts), encoding="utf-8")
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"genie add-on: error: {e}", file=sys.stderr)
        return 2
    key = "an API key" if opts.api_key else "no API key"
    print(f"genie add-on: model {opts.model}, context {opts.ctx}, {key}", file=sys.stderr)
    print("local")
    return 0


if __name__ == "__main__":
    sys.exit(main())
