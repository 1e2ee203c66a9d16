"""`genie-daemon`: serve one model to local clients (see protocol/SPEC.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from genie_common import __version__, scheduling
from genie_common.config import DaemonConfig, default_config_path, load_config

from .log_limit import limited as limited_log
from .server import Daemon


def _ctx(value: str) -> int:
    """--ctx: `auto` is 0 (the worker sizes it from its memory budget)."""
    return 0 if value == "auto" else int(value)


def main(argv: Sequence[str] | None = None) -> int:
    d = DaemonConfig()
    p = argparse.ArgumentParser(prog="genie-daemon", description="genie's supervisor daemon")
    p.add_argument("--version", action="version", version=f"genie {__version__}")
    p.add_argument("--config", type=Path, default=None, help=f"TOML config (default: {default_config_path()})")
    p.add_argument("-m", "--model", help=f"GGUF path, installed or pulled model (default: {d.model})")
    p.add_argument("--models-dir", help=f"where pulled models live (default: {d.models_dir})")
    p.add_argument("--backend", help=f"auto | numpy | cupy (default: {d.backend})")
    p.add_argument("--ctx", type=_ctx, help="context length in tokens, or auto (default: auto)")
    p.add_argument(
        "--mem-budget-mb",
        type=int,
        help="memory the model, its KV cache and a step may take (default: 0, what is free, less a tenth)",
    )
    p.add_argument("--fp16-kv", action="store_true", default=None, help="FP16 KV cache (default: INT8)")
    p.add_argument("--socket-dir", help=f"directory of the ipc sockets (default: {d.socket_dir})")
    p.add_argument("--max-queue", type=int, help=f"waiting requests before 'overloaded' (default: {d.max_queue})")
    p.add_argument(
        "--parallel",
        type=int,
        help=f"requests the worker runs at once, 0 for the worker's default (default: {d.parallel})",
    )
    p.add_argument(
        "--max-tokens-default",
        type=int,
        help=f"an answer's token cap when a request sets none (default: {d.max_tokens_default})",
    )
    p.add_argument("--prefill-chunk", type=int, help=f"prompt tokens per forward pass (default: {d.prefill_chunk})")
    p.add_argument(
        "--stream-interval-ms",
        type=float,
        help=f"send a request's text at most this often, ms (default: {d.stream_interval_ms})",
    )
    p.add_argument("--kv-cache-dir", help=f"where conversations' KV is saved (default: {d.kv_cache_dir})")
    p.add_argument("--kv-cache-max-mb", type=int, help=f"size cap of the saved KV, MB (default: {d.kv_cache_max_mb})")
    p.add_argument("--no-kv-store", dest="kv_store", action="store_false", default=None, help="no saved KV")
    p.add_argument("--http-host", help=f"bind address of the HTTP API (default: {d.http_host})")
    p.add_argument("--http-port", type=int, help=f"port of the HTTP API, 0 for any free one (default: {d.http_port})")
    p.add_argument("--no-http", dest="http", action="store_false", default=None, help="no HTTP API")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    with limited_log(logging.getLogger().handlers):  # one line a second of each kind (log_limit.py)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    scheduling.latency_sensitive()  # before its threads and children start: they inherit it (scheduling.py)
    try:
        flags = {f.name: getattr(args, f.name) for f in fields(DaemonConfig) if hasattr(args, f.name)}
        config = load_config(args.config, flags)  # a flag's dest is its option's name
    except (ValueError, OSError) as e:
        print(f"genie-daemon: error: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_serve(config))


async def _serve(config: DaemonConfig) -> int:
    try:
        daemon = Daemon(config)
    except Exception as e:  # a socket that cannot be bound, a directory that cannot be made
        print(f"genie-daemon: error: {e}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop, sig.name)  # the handler only sets a flag
    logging.getLogger("genie.daemon").info("event=listening endpoint=%s", config.client_endpoint)
    try:
        await daemon.run()
    except OSError as e:  # the HTTP port is taken or not ours to bind
        print(f"genie-daemon: error: HTTP on {config.http_host}:{config.http_port}: {e}", file=sys.stderr)
        await daemon.shutdown()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
