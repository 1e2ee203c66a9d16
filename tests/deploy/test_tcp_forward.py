"""The add-on's forward mode: bytes pass both ways unchanged, half-closes pass on, a dead target closes."""

import asyncio
import contextlib
import socket

from genie_daemon.tcp_forward import Forwarder


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def _forwarding(target_port: int):
    """(reader, writer, stopping) of a client connected through a forwarder to target_port."""
    stopping, port = asyncio.Event(), _free_port()
    serving = asyncio.create_task(Forwarder("127.0.0.1", target_port).serve("127.0.0.1", port, stopping))
    for _ in range(200):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            await asyncio.sleep(0.01)
    try:
        yield reader, writer, stopping
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        stopping.set()
        await asyncio.wait_for(serving, 10)


async def _with_echo_target(scenario) -> None:
    target = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with target, _forwarding(target.sockets[0].getsockname()[1]) as (reader, writer, stopping):
        await asyncio.wait_for(scenario(reader, writer, stopping), 10)


def test_bytes_pass_both_ways_and_eof_passes_on():
    async def scenario(reader, writer, stopping):
        payload = bytes(range(256)) * 1024  # 256 KiB: many reads and writes
        writer.write(payload)
        writer.write_eof()  # the target sees EOF, sends the rest back and closes
        assert await reader.read() == payload

    asyncio.run(_with_echo_target(scenario))


def test_stop_ends_open_connections():
    async def scenario(reader, writer, stopping):
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        stopping.set()  # SIGTERM's flag, with this connection still open
        assert await reader.read() == b""

    asyncio.run(_with_echo_target(scenario))


def test_unreachable_target_closes_the_client():
    async def run(port: int) -> None:
        async with _forwarding(port) as (reader, _, _):
            assert await asyncio.wait_for(reader.read(), 10) == b""

    with socket.socket() as s:  # bound, never listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        asyncio.run(run(s.getsockname()[1]))
