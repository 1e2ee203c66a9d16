"""The daemon with its real worker process on a tiny model, driven through GenieClient."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol.client import GenieClient
from protocol.messages import Delta, Done, Error, Reply
from tests.tiny_models import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
LONG = {"token_ids": [1] + [3 + i % 300 for i in range(200)], "params": {"max_tokens": 250, "ignore_eos": True}}


def start_daemon(tmp: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    model = tmp / "tiny.gguf"
    if not model.exists():
        write_tiny_model("llama", model)
    sock_dir = tmp / "run"
    cmd = [
        sys.executable,
        "-m",
        "genie_daemon",
        "-m",
        str(model),
        "--ctx",
        "512",
        "--socket-dir",
        str(sock_dir),
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True
    )
    endpoint = f"ipc://{sock_dir}/genie.sock"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = asyncio.run(status(endpoint))
        if isinstance(reply, Reply) and reply.data["ready"]:
            return proc, endpoint
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"daemon not ready: {proc.stderr.read() if proc.stderr else ''}")


async def status(endpoint: str) -> Reply | Error:
    async with GenieClient(endpoint, timeout_s=1) as c:
        return await c.status()


async def collect(client: GenieClient, **fields) -> tuple[list[Delta], Done | Error]:
    deltas = []
    async for ev in client.generate(**fields):
        if isinstance(ev, Delta):
            deltas.append(ev)
        else:
            return deltas, ev
    raise AssertionError("generate ended without DONE or ERROR")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    proc, endpoint = start_daemon(tmp_path_factory.mktemp("daemon"), "--max-queue", "2")
    yield proc, endpoint
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


def test_streaming_through_the_daemon(daemon):
    _, endpoint = daemon

    async def go():
        async with GenieClient(endpoint) as c:
            return await collect(
                c, token_ids=[1, 5, 6, 7], params={"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}
            )

    deltas, done = asyncio.run(go())
    assert isinstance(done, Done) and done.finish_reason == "length" and done.usage["completion_tokens"] == 8
    assert deltas and all(d.request_id == done.request_id for d in deltas)


def test_two_clients_at_once_and_overload(daemon):
    _, endpoint = daemon

    async def go():
        clients = [GenieClient(endpoint) for _ in range(4)]
        try:
            return await asyncio.gather(*(collect(c, **LONG) for c in clients))
        finally:
            for c in clients:
                await c.close()

    results = [end for _, end in asyncio.run(go())]
    done = [r for r in results if isinstance(r, Done)]
    overloaded = [r for r in results if isinstance(r, Error) and r.code == "overloaded"]
    assert len(done) == 3 and len(overloaded) == 1  # one running, two waiting (--max-queue 2), one refused


def test_cancel_ends_the_running_request(daemon):
    _, endpoint = daemon

    async def go():
        async with GenieClient(endpoint) as c:
            task = asyncio.ensure_future(collect(c, request_id="long-1", **LONG))
            await asyncio.sleep(0.3)
            await c.cancel("long-1")
            return await task

    _, end = asyncio.run(go())
    assert isinstance(end, Done) and end.finish_reason == "cancelled"


def test_malformed_frames_get_errors_and_the_daemon_stays_up(daemon):
    import zmq

    _, endpoint = daemon
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for frame in (b"", b"\x01\xc1", b"\x7e\x81\xaarequest_id\xa1x", b"\x01\x80"):
            sock.send(frame)
            assert sock.poll(5000), "no ERROR reply"
            assert sock.recv_multipart()[0][0] == 0x04  # ERROR
    finally:
        sock.close()
        ctx.term()
    assert isinstance(asyncio.run(status(endpoint)), Reply)


def test_killed_worker_fails_the_request_and_is_restarted(daemon):
    _, endpoint = daemon

    async def go():
        async with GenieClient(endpoint) as c:
            task = asyncio.ensure_future(collect(c, **LONG))
            await asyncio.sleep(0.3)
            pid = (await c.status()).data["worker_pid"]
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            _, end = await task
            waited = time.monotonic() - t0
            for _ in range(150):  # the restarted worker loads, then serves
                _, again = await collect(c, token_ids=[1, 2, 3], params={"max_tokens": 2})
                if isinstance(again, Done):
                    break
                await asyncio.sleep(0.2)
            return end, waited, again, (await c.status()).data

    end, waited, again, info = asyncio.run(go())
    assert isinstance(end, Error) and end.code == "worker_died" and waited < 5
    assert isinstance(again, Done) and info["worker_restarts"] >= 1


def test_sigterm_exits_zero_and_leaves_no_worker(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    worker_pid = asyncio.run(status(endpoint)).data["worker_pid"]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
