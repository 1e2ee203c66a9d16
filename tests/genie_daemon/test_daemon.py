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

from genie_common import scheduling
from genie_common.config import DaemonConfig
from genie_daemon.server import Daemon
from genie_protocol.client import GenieClient
from genie_protocol.codec import decode
from genie_protocol.messages import Delta, Done, Error, Generate, Prewarm, Reply
from testkit.tiny_models import write_tiny_model
from tests.child_env import child_env
from tests.genie_common.test_scheduling import DEFAULT, needs_slices

ROOT = Path(__file__).resolve().parents[2]
LONG = {"token_ids": [1] + [3 + i % 300 for i in range(200)], "params": {"max_tokens": 250, "ignore_eos": True}}


def start_daemon(
    tmp: Path,
    *extra: str,
    model: str | None = None,
    ctx: int = 512,
    backend: str = "auto",
    ready_timeout_s: float = 30,
    umask: int = -1,
    wrap: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, str]:
    """A daemon on `model` (default: a tiny llama file written into `tmp`), its sockets and KV in `tmp`;
    `umask`: the one it starts under (-1: this process's); `wrap`: a command that runs it (`unshare …`: a
    small disk for its KV)."""
    if model is None:
        model = str(tmp / "tiny.gguf")
        if not Path(model).exists():
            write_tiny_model("llama", Path(model))
    sock_dir = tmp / "run"
    cmd = [
        *wrap,
        sys.executable,
        "-m",
        "genie_daemon",
        "-m",
        model,
        "--ctx",
        str(ctx),
        "--backend",
        backend,
        "--socket-dir",
        str(sock_dir),
        "--kv-cache-dir",
        str(tmp / "kv"),
        "--http-port",
        "0",  # any free port: test daemons never fight over 11434
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True, umask=umask)
    endpoint = f"ipc://{sock_dir}/genie.sock"
    deadline = time.monotonic() + ready_timeout_s
    problem = "not ready"
    while time.monotonic() < deadline:
        reply = asyncio.run(status(endpoint))
        if isinstance(reply, Reply) and reply.data["ready"]:
            return proc, endpoint
        if isinstance(reply, Reply) and reply.data["load_error"]:  # never retried: no use waiting on
            problem = reply.data["load_error"]
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"daemon {problem}: {proc.communicate(timeout=10)[1]}")


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


def test_status_gives_the_context_and_the_memory_plan(daemon):
    """The worker sized its context from its memory budget (--ctx 512 here) and says what it holds."""
    _, endpoint = daemon
    data = asyncio.run(status(endpoint)).data
    memory = data["memory"]
    assert data["ctx"] == memory["ctx"] == 512 and memory["slots"] == data["slots"]["total"]
    assert 0 < memory["total_mb"] <= memory["budget_mb"]
    assert memory["total_mb"] >= memory["weights_mb"] + memory["kv_mb"] + memory["scratch_mb"] - 2  # (each rounded)


def test_two_clients_at_once_and_overload(daemon):
    """As many requests as the worker has slots run, --max-queue 2 more wait, and one more is refused."""
    _, endpoint = daemon
    slots = asyncio.run(status(endpoint)).data["slots"]["total"]

    async def go():
        clients = [GenieClient(endpoint) for _ in range(slots + 3)]
        try:
            return await asyncio.gather(*(collect(c, **LONG) for c in clients))
        finally:
            for c in clients:
                await c.close()

    results = [end for _, end in asyncio.run(go())]
    done = [r for r in results if isinstance(r, Done)]
    overloaded = [r for r in results if isinstance(r, Error) and r.code == "overloaded"]
    assert len(done) == slots + 2 and len(overloaded) == 1


def test_cancel_ends_the_running_request(daemon):
    _, endpoint = daemon

    async def go():
        async with GenieClient(endpoint) as c:
            n = 0
            async for ev in c.generate(request_id="long-1", **LONG):
                n += 1
                if n == 1:  # streaming has begun: cancel
                    await c.cancel("long-1")
                if not isinstance(ev, Delta):
                    return ev, n
        raise AssertionError("no DONE")

    end, n = asyncio.run(go())
    assert isinstance(end, Done) and end.finish_reason == "cancelled" and end.usage["completion_tokens"] < 250


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
            pid = (await c.status()).data["worker_pid"]
            t0 = end = None
            async for ev in c.generate(**LONG):
                if t0 is None:  # mid-stream
                    os.kill(pid, signal.SIGKILL)
                    t0 = time.monotonic()
                if not isinstance(ev, Delta):
                    end = ev
                    break
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
    data = asyncio.run(status(endpoint)).data
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    time.sleep(0.5)
    for pid in (data["worker_pid"], data["kv_store_pid"]):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def ctl(sock_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "genie_daemon.ctl", "--socket-dir", str(sock_dir), *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_genie_ctl(daemon, tmp_path):
    import json
    import stat

    _, endpoint = daemon
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    assert stat.S_IMODE((sock_dir / "admin.sock").stat().st_mode) == 0o600
    r = ctl(sock_dir, "status")
    assert r.returncode == 0 and "worker_pid" in r.stdout and "model" in r.stdout
    info = json.loads(ctl(sock_dir, "--json", "status").stdout)
    assert info["ready"] is True and info["daemon_pid"] > 0 and info["load_ms"] > 0
    assert json.loads(ctl(sock_dir, "status", "--json").stdout)["daemon_pid"] == info["daemon_pid"]
    assert ctl(sock_dir, "health").returncode == 0
    r = ctl(sock_dir, "--json", "generate", "hello", "-n", "3")
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["usage"]["completion_tokens"] <= 3
    counters = json.loads(ctl(sock_dir, "metrics", "--json").stdout)  # the counters, not the status again
    assert counters["genie_generated_tokens_total"] >= 1 and counters["genie_ready"] == 1
    assert "worker_pid" not in counters and "genie_generated_tokens_total" in ctl(sock_dir, "metrics").stdout
    r = ctl(tmp_path / "nothing-here", "status")
    assert r.returncode == 2 and "not running" in r.stderr and "Traceback" not in r.stderr


def test_stopped_worker_is_detected_and_replaced(daemon):
    _, endpoint = daemon

    async def go():
        async with GenieClient(endpoint) as c:
            before = (await c.status()).data
            os.kill(before["worker_pid"], signal.SIGSTOP)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                now = (await c.status()).data
                if now["worker_pid"] != before["worker_pid"]:
                    return before, now, time.monotonic() - t0
                await asyncio.sleep(0.1)
            return before, now, None

    before, after, waited = asyncio.run(go())
    assert waited is not None and waited < 5, "the hung worker was not replaced within 5 s"
    assert after["worker_restarts"] == before["worker_restarts"] + 1


def test_fuzzed_frames_keep_the_daemon_up_and_answered(daemon):
    """1 000 seeded malformed frames (CI); every frame that names a request id gets an ERROR for it."""
    fuzz_daemon(daemon, 1000)


@pytest.mark.soak
def test_fuzzed_frames_long(daemon):
    fuzz_daemon(daemon, 10_000)


def fuzz_daemon(daemon, n: int) -> None:
    import random

    import msgpack
    import zmq

    proc, endpoint = daemon
    rss_before = _rss_kb(proc.pid)
    rng = random.Random(7)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for i in range(n):
            rid = f"f{i}"
            kind = i % 7
            if kind == 0:  # random bytes
                frame = bytes((rng.randrange(256),)) + rng.randbytes(rng.randrange(64))
            elif kind == 1:  # a wrong type
                frame = b"\x01" + msgpack.packb({"request_id": rid, "prompt": rng.randrange(10)})
            elif kind == 2:  # nesting where strings belong
                frame = b"\x01" + msgpack.packb({"request_id": rid, "messages": [[[]] * 3] * 5})
            elif kind == 3:  # unknown message types
                frame = bytes((rng.choice([0x7E, 0x30, 0x99]),)) + msgpack.packb({"request_id": rid})
            elif kind == 4:  # a length field far past the frame
                frame = (
                    b"\x01\x82" + msgpack.packb("request_id") + msgpack.packb(rid) + b"\xa6prompt\xdb\xff\xff\xff\xf0ab"
                )
            elif kind == 5:  # deep nesting after the id
                frame = b"\x01\x82\xaarequest_id" + msgpack.packb(rid) + b"\xa1x" + b"\x91" * 5000 + b"\xc0"
            else:  # bad parameters; every 70th an oversize frame, refused unread (so no id), still answered
                frame = (
                    b"\x01" + msgpack.packb({"request_id": rid, "prompt": "x" * (5 << 20)})
                    if i % 70 == 6
                    else b"\x01" + msgpack.packb({"request_id": rid, "prompt": "x", "params": {"top_k": "many"}})
                )
            sock.send(frame)
            assert sock.poll(5000), f"no answer to frame {i}"
            reply = decode(sock.recv_multipart())[0]
            assert isinstance(reply, Error), reply
            if kind != 0 and not (kind == 6 and i % 70 == 6):  # random bytes and oversize frames name no readable id
                assert reply.request_id == rid, (kind, reply)
    finally:
        sock.close()
        ctx.term()
    assert isinstance(asyncio.run(status(endpoint)), Reply)
    assert _rss_kb(proc.pid) - rss_before < 50_000


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_cancel_during_a_long_prefill_returns_within_one_chunk(tmp_path):
    proc, endpoint = start_daemon(tmp_path, "--prefill-chunk", "1")  # 480 passes: the cancel lands inside them

    async def go():
        async with GenieClient(endpoint) as c:
            gen = c.generate(
                request_id="pf", token_ids=[1] + [3 + i % 300 for i in range(480)], params={"max_tokens": 5}
            )
            first = asyncio.ensure_future(gen.__anext__())
            await asyncio.sleep(0.05)  # the worker is prefilling a token at a time
            t0 = time.monotonic()
            await c.cancel("pf")
            end = await first
            return end, time.monotonic() - t0

    try:
        end, waited = asyncio.run(go())
        assert isinstance(end, Done) and end.finish_reason == "cancelled" and end.usage.get("completion_tokens", 0) == 0
        assert waited < 30  # a hang guard: how soon a cancel lands is measured, not asserted (test_engine.py
        # pins that a prefill stops after the layer the cancel arrives in)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_prewarm_then_generate_reuses_the_prefix(daemon):
    _, endpoint = daemon
    system = [{"role": "system", "content": "You are the kitchen assistant. " * 8}]

    async def go():
        async with GenieClient(endpoint) as c:
            warm = await c.prewarm(messages=[*system, {"role": "user", "content": ""}])
            _, done = await collect(
                c, messages=[*system, {"role": "user", "content": "Timer for ten minutes"}], params={"max_tokens": 2}
            )
            return warm, done

    warm, done = asyncio.run(go())
    assert isinstance(warm, Done) and isinstance(done, Done)
    assert done.usage["cached_tokens"] > 20


def test_daemon_killed_leaves_no_worker_behind(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    data = asyncio.run(status(endpoint)).data
    proc.kill()
    proc.communicate(timeout=10)
    for pid, name in ((data["worker_pid"], "worker"), (data["kv_store_pid"], "KV store")):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the {name} outlived its daemon by more than 5 s")


def test_unload_refuses_work_and_load_serves_a_model_again(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    other = tmp_path / "qwen3.gguf"
    write_tiny_model("qwen3", other)
    try:
        assert ctl(sock_dir, "unload").returncode == 0
        time.sleep(0.5)

        async def ask():
            async with GenieClient(endpoint) as c:
                return await collect(c, token_ids=[1, 2, 3], params={"max_tokens": 2})

        _, refused = asyncio.run(ask())
        assert isinstance(refused, Error) and refused.code == "unloaded"
        r = ctl(sock_dir, "load", str(other))
        assert r.returncode == 0, r.stderr
        _, done = asyncio.run(ask())
        assert isinstance(done, Done)
        bad = ctl(sock_dir, "load", str(tmp_path / "missing.gguf"))
        assert bad.returncode == 1 and "bad_model" in bad.stderr and "no such file" in bad.stderr
        _, still = asyncio.run(ask())  # refused before anything restarted: the loaded model serves on
        assert isinstance(still, Done)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_client_survives_a_daemon_restart(tmp_path):
    proc, endpoint = start_daemon(tmp_path)

    async def go():
        async with GenieClient(endpoint, timeout_s=30) as c:
            _, first = await collect(c, token_ids=[1, 2, 3], params={"max_tokens": 2})
            proc.send_signal(signal.SIGTERM)
            await asyncio.get_running_loop().run_in_executor(None, proc.communicate, None, 30)
            proc2, _ = await asyncio.get_running_loop().run_in_executor(None, start_daemon, tmp_path)
            try:
                _, second = await collect(c, token_ids=[1, 2, 3], params={"max_tokens": 2})
            finally:
                proc2.send_signal(signal.SIGTERM)
                await asyncio.get_running_loop().run_in_executor(None, proc2.communicate, None, 30)
            return first, second

    first, second = asyncio.run(go())
    assert isinstance(first, Done) and isinstance(second, Done)


def test_a_generate_without_max_tokens_gets_the_default_cap(tmp_path):
    """Every front's GENERATE passes through submit: one that asks for no limit gets max_tokens_default
    (issue 16: answers that ran until the context was full); one that asks keeps its own."""
    config = DaemonConfig(socket_dir=str(tmp_path / "run"), kv_store=False, http=False, max_tokens_default=7)

    async def go():
        daemon = Daemon(config)  # no worker started: the requests stay queued where they can be read
        refused: list = []

        async def reply(msg):
            refused.append(msg)

        try:
            for msg in (
                Generate(request_id="a", prompt="x"),
                Generate(request_id="b", prompt="x", params={"max_tokens": 3, "temperature": 0.0}),
                Prewarm(request_id="c", prompt="x"),
            ):
                await daemon.submit("owner", reply, msg)
            return refused, [req.msg for req in daemon.queue.queues["voice"]]
        finally:
            await daemon.shutdown()

    refused, (a, b, c) = asyncio.run(go())
    assert refused == []
    assert a.params == {"max_tokens": 7} and b.params == {"max_tokens": 3, "temperature": 0.0}
    assert isinstance(c, Prewarm)


def test_a_conversation_longer_than_the_context_keeps_its_newest_turns(daemon):
    """Home Assistant's long conversations were refused (400 '… do not fit the context'); now the oldest
    turns are dropped, as Ollama does, and DONE says how many."""
    _, endpoint = daemon
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(12):
        messages += [
            {"role": "user", "content": f"question {i}: " + "lights " * 40},
            {"role": "assistant", "content": "answer " * 40},
        ]
    messages.append({"role": "user", "content": "And now?"})

    async def go():
        async with GenieClient(endpoint, timeout_s=60) as client:
            return await collect(client, messages=messages, params={"max_tokens": 4})

    _, end = asyncio.run(go())
    assert isinstance(end, Done), end
    assert end.usage["dropped_messages"] > 0 and end.usage["dropped_messages"] % 2 == 0  # whole turns
    assert end.usage["prompt_tokens"] <= 512 - 4
    too_long = [{"role": "system", "content": "rules " * 600}, {"role": "user", "content": "hi"}]

    async def refused():
        async with GenieClient(endpoint, timeout_s=60) as client:
            return await collect(client, messages=too_long, params={"max_tokens": 4})

    _, err = asyncio.run(refused())
    assert isinstance(err, Error) and "the system message and the last user message alone" in err.message


@needs_slices
def test_the_daemon_and_its_store_run_with_the_least_slice_and_the_worker_with_the_kernels(daemon):
    """genie_common/scheduling.py: a message that wakes the daemon or the store takes a core from the worker's
    compute threads at once, and the worker's threads keep the default slice the daemon's would have given them."""
    proc, endpoint = daemon
    data = asyncio.run(status(endpoint)).data
    short = scheduling.SHORT_SLICE_NS
    assert scheduling.slice_ns(proc.pid) == scheduling.slice_ns(data["kv_store_pid"]) == short
    worker = data["worker_pid"]
    assert scheduling.slice_ns(worker) == DEFAULT != short  # its main thread, the engine's
    tasks = Path(f"/proc/{worker}/task")
    io = [int(t.name) for t in tasks.iterdir() if (t / "comm").read_text().strip() == "ZMQbg/IO/0"]
    assert io and all(scheduling.slice_ns(tid) == short for tid in io)
