"""Where the daemon's sockets live by default: the one place the daemon's config and clients that
are given no endpoint both take it from."""

from __future__ import annotations

import os
from pathlib import Path


def default_socket_dir() -> Path:
    """$XDG_RUNTIME_DIR/genie for a user's daemon, else /run/genie (the systemd unit's RuntimeDirectory)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "genie" if base else Path("/run/genie")


def client_endpoint(socket_dir: str | Path | None = None) -> str:
    """The daemon's client socket in `socket_dir` (default: `default_socket_dir()`)."""
    return f"ipc://{socket_dir or default_socket_dir()}/genie.sock"
