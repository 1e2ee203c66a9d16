"""Issue 17 with the real daemon and the real worker on a tiny model: a worker started with --parallel 2
runs two requests at once, each streaming while the other does (over HTTP too), a cancel ending only its
own, a third waiting for a free slot. tests/genie_daemon/test_slots.py checks the daemon's side against a
played worker."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request

import pytest

from genie_protocol.client import GenieClient
from genie_protocol.messages import Delta, Done
from testkit.tiny_models import write_tiny_model
from tests.genie_daemon.test_daemon import start_daemon, status
from tests.genie_daemon.test_http_live import free_port

PARALLEL_LONG = {
    "token_ids": [1] + [3 + i % 300 for i in range(40)],
    "params": {"max_tokens": 3000, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def parallel_daemon(tmp_path_factory):
    """A daemon whose worker runs two requests at once, on a tiny model with a context long enough that
    an answer of 3 000 tokens lasts a second or more (250 tokens take 0.14 s on 2 CPU cores)."""
    tmp = tmp_path_factory.mktemp("parallel")
    model = tmp / "tiny-4k.gguf"
    write_tiny_model("llama", model, context_length=4096)
    port = free_port()
    proc, endpoint = start_daemon(tmp, "--parallel", "2", "--http-port", str(port), model=str(model), ctx=4096)
    yield proc, endpoint, f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


async def stream_together(client: GenieClient, rids: list[str], log: list[tuple[str, str]], started: dict) -> list:
    """Streams one request per id at once; `log` gets (id, DELTA | DONE | ERROR) in the order they arrive,
    `started[id]` is set at its first DELTA. Returns each request's last event."""

    async def one(rid: str):
        async for ev in client.generate(request_id=rid, **PARALLEL_LONG):
            log.append((rid, type(ev).__name__.upper()))
            if isinstance(ev, Delta):
                started[rid].set()
            else:
                return ev
        raise AssertionError("no DONE")

    for rid in rids:
        started[rid] = asyncio.Event()
    return await asyncio.gather(*(one(rid) for rid in rids))


async def start_together(c: GenieClient, rids: list[str], log: list[tuple[str, str]]) -> asyncio.Future:
    """The requests streaming at once (stream_together), returned once each has its first DELTA."""
    started: dict[str, asyncio.Event] = {}
    both = asyncio.ensure_future(stream_together(c, rids, log, started))
    await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 60)
    return both


def ends_at_length(end) -> bool:
    return isinstance(end, Done) and end.finish_reason == "length" and end.usage["completion_tokens"] == 3000


def test_parallel_requests_stream_at_once_in_two_slots(parallel_daemon):
    """Two long requests both stream before either ends, and STATUS counts both slots in use."""
    _, endpoint, _ = parallel_daemon

    async def go():
        log: list[tuple[str, str]] = []
        async with GenieClient(endpoint) as c:
            both = await start_together(c, ["p1", "p2"], log)
            during = (await c.status()).data
            return log, during, await both

    log, during, ends = asyncio.run(go())
    first_end = next(k for k, (_, kind) in enumerate(log) if kind != "DELTA")
    assert {rid for rid, _ in log[:first_end]} == {"p1", "p2"}, log[: first_end + 1]
    assert during["running"] == 2 and during["slots"] == {"in_use": 2, "total": 2}, during
    assert all(ends_at_length(e) for e in ends), ends


def test_parallel_cancel_ends_one_request_and_the_other_finishes(parallel_daemon):
    _, endpoint, _ = parallel_daemon

    async def go():
        log: list[tuple[str, str]] = []
        async with GenieClient(endpoint) as c:
            both = await start_together(c, ["keep", "drop"], log)
            await c.cancel("drop")
            return log, await both

    log, (kept, dropped) = asyncio.run(go())
    assert isinstance(dropped, Done) and dropped.finish_reason == "cancelled", dropped
    assert dropped.usage["completion_tokens"] < 3000
    assert ends_at_length(kept), kept
    ends = [rid for rid, kind in log if kind != "DELTA"]
    assert ends == ["drop", "keep"]  # the cancel did not wait for the other request


def test_parallel_a_third_request_waits_for_a_free_slot(parallel_daemon):
    _, endpoint, _ = parallel_daemon

    async def go():
        log: list[tuple[str, str]] = []
        started: dict[str, asyncio.Event] = {}
        async with GenieClient(endpoint) as c:
            two = asyncio.ensure_future(stream_together(c, ["s1", "s2"], log, started))
            await asyncio.sleep(0)
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 60)
            third = asyncio.ensure_future(stream_together(c, ["s3"], log, started))
            await asyncio.sleep(0.05)  # its GENERATE is on the socket before the STATUS below
            during = (await c.status()).data
            return log, during, [*await two, *await third]

    log, during, ends = asyncio.run(go())
    assert during["queue"] == 1 and during["slots"] == {"in_use": 2, "total": 2}, during
    first_end = next(k for k, (_, kind) in enumerate(log) if kind != "DELTA")
    third_starts = log.index(("s3", "DELTA"))
    assert first_end < third_starts, log  # it ran once one of the first two had ended
    assert all(ends_at_length(e) for e in ends), ends


def test_parallel_http_streams_run_at_once(parallel_daemon):
    """Two Ollama streams: the second begins while the first is under way, both in flight together."""
    _, endpoint, url = parallel_daemon
    body = {"model": "tiny-4k", "prompt": "once upon a time", "raw": True}
    body["options"] = {"num_predict": 3000, "ignore_eos": True, "temperature": 0}
    streams = []
    for _ in range(2):
        req = urllib.request.Request(url + "/api/generate", data=json.dumps(body).encode())
        streams.append(urllib.request.urlopen(req, timeout=60))
        assert json.loads(streams[-1].readline())["done"] is False  # streaming
    during = asyncio.run(status(endpoint)).data
    finals = [[json.loads(line) for line in s][-1] for s in streams]
    assert during["running"] == 2 and during["slots"] == {"in_use": 2, "total": 2}, during
    assert all(f["done"] and f["done_reason"] == "length" and f["eval_count"] == 3000 for f in finals), finals
