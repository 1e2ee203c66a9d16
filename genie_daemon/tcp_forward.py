"""A plain TCP forwarder: the Home Assistant add-on's forward mode, port 11434 to genie on a GPU host.

Bytes pass through untouched in both directions (HTTP, streaming, keep-alive alike); a half-close on one
side is passed on, a reset or a failed connect closes both sides. SIGTERM stops listening and ends open
connections. `python -m genie_daemon.tcp_forward [--listen-host H] [--listen-port P] HOST PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

log = logging.getLogger("genie.forward")

CONNECT_TIMEOUT_S = 10.0
CHUNK_BYTES = 64 * 1024


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close dst; on an error close dst, which ends the other direction too."""
    try:
        while data := await src.read(CHUNK_BYTES):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except OSError:
        dst.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class Forwarder:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.connections: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as e:
                log.warning("event=connect_failed target=%s:%d error=%s", *self.target, str(e) or type(e).__name__)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                await _close(up_writer)
        finally:
            await _close(writer)
            self.connections.discard(task)

    async def serve(self, host: str, port: int, stopping: asyncio.Event) -> None:
        """Listens until `stopping` is set, then ends the open connections."""
        server = await asyncio.start_server(self.handle, host, port)
        log.info("event=listening on=%s:%d target=%s:%d", host, port, *self.target)
        async with server:
            await stopping.wait()
            server.close()
            for task in list(self.connections):
                task.cancel()
            await asyncio.gather(*self.connections, return_exceptions=True)


async def _run(args: argparse.Namespace) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)  # the handler only sets a flag
    try:
        await Forwarder(args.host, args.port).serve(args.listen_host, args.listen_port, stopping)
    except OSError as e:  # the listening port is taken or not allowed
        print(f"genie-forward: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="genie-forward", description="forward a TCP port to genie on another host")
    p.add_argument("--listen-host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    p.add_argument("--listen-port", type=int, default=11434, help="port to listen on (default: 11434)")
    p.add_argument("host", help="target host")
    p.add_argument("port", type=int, help="target port")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
