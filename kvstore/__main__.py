"""`python -m genie_kvstore`: the KV-store process the daemon starts (kvstore/server.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from genie_common import heap, scheduling
from genie_common.child_config import StorePart, from_arg
from genie_common.lifetime import exit_with_parent

from .server import KVStoreServer, ServerConfig
from .store import StoreConfig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="genie-kvstore", description="genie's KV-store process, started by the daemon")
    p.add_argument("--part", required=True, help="its part of the daemon's configuration, JSON (child_config.py)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    exit_with_parent()
    scheduling.latency_sensitive()  # its lookups are on a first token's path (scheduling.py)
    heap.map_large_blocks()  # before the first save's frames: each is a block of its own, returned when freed
    try:
        part = from_arg(StorePart, args.part)
        if part.max_mb < 0 or part.stale_tmp_s < 0:
            raise ValueError("max_mb and stale_tmp_s must be >= 0")
    except ValueError as e:
        print(f"genie-kvstore: error: {e}", file=sys.stderr)
        return 2
    config = ServerConfig(part.endpoint, StoreConfig(Path(part.directory), part.max_mb << 20, part.stale_tmp_s))
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
