"""`python -m kvstore`: the KV-store process the daemon starts (kvstore/server.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from genie_common.config import KV_CACHE_MAX_MB, KV_CACHE_STALE_TMP_S
from genie_common.lifetime import exit_with_parent

from .server import KVStoreServer, ServerConfig
from .store import StoreConfig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="genie-kvstore", description="genie's KV-store process")
    p.add_argument("--endpoint", required=True, help="the socket to bind, e.g. ipc:///run/genie/kv.sock")
    p.add_argument("--dir", required=True, type=Path, help="the cache directory")
    p.add_argument(
        "--max-mb",
        type=int,
        default=KV_CACHE_MAX_MB,
        help="size cap of the entries, MB; 0 = none (default: %(default)s)",
    )
    p.add_argument(
        "--stale-tmp-s",
        type=float,
        default=KV_CACHE_STALE_TMP_S,
        help="temp files older than this are removed (default: %(default)s)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    exit_with_parent()
    if args.max_mb < 0 or args.stale_tmp_s < 0:
        print("genie-kvstore: error: --max-mb and --stale-tmp-s must be >= 0", file=sys.stderr)
        return 2
    config = ServerConfig(args.endpoint, StoreConfig(args.dir, args.max_mb << 20, args.stale_tmp_s))
    try:
        server = KVStoreServer(config)
    except Exception as e:  # a directory that cannot be made, a socket that cannot be bound
        print(f"genie-kvstore: error: {e}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: object) -> None:  # only sets a flag; the loop acts on it
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
