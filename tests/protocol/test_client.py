"""GenieClient's default endpoint is where the daemon listens by default, and protocol/ stays free of
the rest of genie (clients install it alone)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from genie_common.config import DaemonConfig
from protocol.client import GenieClient

PROTOCOL = Path(__file__).resolve().parents[2] / "protocol"


@pytest.mark.parametrize(
    ("runtime_dir", "expected"), [("/run/user/1000", "/run/user/1000/genie"), (None, "/run/genie")]
)
def test_no_endpoint_is_the_daemons_default_socket(monkeypatch, runtime_dir, expected):
    if runtime_dir is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime_dir)
    monkeypatch.delenv("GENIE_SOCKET_DIR", raising=False)
    client = GenieClient()
    try:
        assert client.endpoint == f"ipc://{expected}/genie.sock"
        assert client.endpoint == DaemonConfig().client_endpoint  # one fact: where the daemon binds it
    finally:
        asyncio.run(client.close())


def test_protocol_imports_nothing_else_of_genie():
    others = {"genie_daemon", "workers", "kvstore"}
    for path in PROTOCOL.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & others, f"{path.name} imports {names}"
