"""GenieClient's default endpoint is where the daemon listens by default, its answers reach the request they
name, in order, ending in a timeout when none comes; and protocol/ stays free of the rest of genie (clients
install it alone)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_protocol.client import GenieClient
from genie_protocol.codec import decode, encode
from genie_protocol.messages import Delta, Done, Error, Generate

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


def test_answers_reach_their_request_in_order_and_silence_ends_in_a_timeout(tmp_path):
    """A stand-in daemon answers the first request with eight DELTAs and a DONE sent at once (so most wait in
    the request's queue before they are read) and the second, which runs alongside, with nothing: the first
    gets its answers in order, the second an ERROR(timeout) once the client's timeout has passed."""

    async def run() -> tuple[list, list, float]:
        endpoint = f"ipc://{tmp_path}/d.sock"
        ctx = zmq.asyncio.Context()
        daemon = ctx.socket(zmq.ROUTER)
        daemon.bind(endpoint)

        async def serve() -> None:
            for _ in range(2):
                peer, *frames = await daemon.recv_multipart()
                msg, _ = decode(frames)
                assert isinstance(msg, Generate)
                if msg.token_ids == [1]:
                    answers = [Delta(request_id=msg.request_id, text=f"{i} ", token_ids=[i]) for i in range(8)]
                    for answer in [*answers, Done(request_id=msg.request_id, finish_reason="length")]:
                        await daemon.send_multipart([peer, *encode(answer)])

        async def collect(client: GenieClient, ids: list[int]) -> list:
            return [ev async for ev in client.generate(token_ids=ids, params={"max_tokens": 8})]

        server = asyncio.create_task(serve())
        try:
            async with GenieClient(endpoint, timeout_s=0.3) as client:
                t0 = asyncio.get_running_loop().time()
                answered, silent = await asyncio.gather(collect(client, [1]), collect(client, [2]))
                waited = asyncio.get_running_loop().time() - t0
        finally:
            server.cancel()
            daemon.close(0)
            ctx.term()
        return answered, silent, waited

    answered, silent, waited = asyncio.run(run())
    assert [ev.text for ev in answered[:-1]] == [f"{i} " for i in range(8)]
    assert isinstance(answered[-1], Done) and answered[-1].finish_reason == "length"
    assert len(silent) == 1 and isinstance(silent[0], Error) and silent[0].code == "timeout"
    assert 0.3 <= waited < 5


def test_protocol_imports_nothing_else_of_genie():
    others = {"genie_daemon", "genie_workers", "genie_kvstore"}
    for path in PROTOCOL.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & others, f"{path.name} imports {names}"
