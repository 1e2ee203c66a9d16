"""What the daemon costs: per-token overhead of the daemon hop, the hop to the first token, and idle CPU of all
genie processes.

    python bench/service.py [-m MODEL] [--tokens 200]

Same run, same model, greedy: decode time per token of the engine in this process against the time per
token a client sees through genie-daemon (its worker process runs the same engine), alternating the two
and taking medians, since a 2-core machine's speed drifts between runs. Then 10 s of idle:
CPU seconds of the daemon, its worker and its KV store from /proc. Default model: a tiny random llama written here,
whose ~1 ms steps make the hop visible; -m gemma3-270m shows the same hop against a real step.
`--stream-interval-ms 0` measures one DELTA per token (the daemon's default coalesces 5 ms of tokens).
Beside the hop, in the same alternation: a bare round trip of one small message between this process and an echo
process (pyzmq DEALER/ROUTER over ipc, asyncio, as the client and the daemon use them): the first message with the
echo process idle since the last repeat, as the daemon's worker is before a request, then one with both awake.
The hop to the first token crosses two round trips (client -> daemon -> worker and back).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genie_common.engine_options import EngineOptions  # noqa: E402
from genie_protocol.client import GenieClient  # noqa: E402
from genie_protocol.messages import Delta, Done, Reply  # noqa: E402
from genie_workers.engine.engine import Completion, Engine  # noqa: E402
from genie_workers.engine.sampling import SamplingParams  # noqa: E402

PROMPT = [1, 5, 6, 7, 8]
ECHO = """
import asyncio, sys, zmq, zmq.asyncio
async def main():
    sock = zmq.asyncio.Context().socket(zmq.ROUTER)
    sock.bind(sys.argv[1])
    while True:
        await sock.send_multipart(await sock.recv_multipart())
try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
asyncio.run(main())
"""


async def bare_round_trips(endpoint: str) -> tuple[float, float]:
    """A 64-byte message's round trip to the echo process: the first on a connection made 50 ms before (the
    echo process idle since the last repeat, as the daemon's worker is before a request), then one right after
    (both ends awake)."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    try:
        await asyncio.sleep(0.05)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            await sock.send(b"x" * 64)
            await sock.recv()
            times.append(time.perf_counter() - t0)
        return times[0], times[1]
    finally:
        sock.close(0)
        ctx.term()


def in_process(engine: Engine, n: int) -> tuple[float, float]:
    """Per token after the first, and the first token's time from the call (an empty slot)."""
    engine.kv.clear(0)
    t_first = None
    t0 = time.perf_counter()
    for ev in engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)):
        if t_first is None:
            t_first = time.perf_counter()
        if isinstance(ev, Completion):
            return (time.perf_counter() - t_first) / (ev.completion_tokens - 1), t_first - t0
    raise AssertionError("no completion")


async def through_daemon(endpoint: str, n: int) -> tuple[float, float, int, float, float]:
    """Per token: the client's time, the worker engine's own decode time; the DELTAs received; the first
    DELTA's time from the client's send (a connected client) and the worker's own time to the first token
    (from its sequence's creation, the KV store's lookup included)."""
    async with GenieClient(endpoint) as client:
        await client.status()  # connected before the clock starts
        t_first = None
        deltas = 0
        params = {"temperature": 0.0, "max_tokens": n, "ignore_eos": True}
        t0 = time.perf_counter()
        async for ev in client.generate(token_ids=PROMPT, params=params):
            if isinstance(ev, Delta):
                deltas += 1
                t_first = t_first or time.perf_counter()
            elif isinstance(ev, Done) and t_first is not None:
                wall = (time.perf_counter() - t_first) / (ev.usage["completion_tokens"] - 1)
                return wall, 1 / ev.timings["decode_tok_s"], deltas, t_first - t0, ev.timings["ttft_ms"] / 1e3
    raise AssertionError("no DONE from the daemon")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_ready(endpoint: str) -> dict:
    for _ in range(600):
        async with GenieClient(endpoint, timeout_s=1) as c:
            reply = await c.status()
        if isinstance(reply, Reply) and reply.data["ready"]:
            return reply.data
        await asyncio.sleep(0.2)
    raise SystemExit("the daemon did not become ready")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="GGUF path or installed model (default: a tiny random llama)")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=9, help="alternating runs of each (default: %(default)s)")
    p.add_argument("--stream-interval-ms", type=float, default=5.0, help="the daemon's option (default: %(default)s)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genie-bench-"))
    model = args.model
    if model is None:
        from testkit.tiny_models import write_tiny_model

        model = str(tmp / "tiny.gguf")
        write_tiny_model("llama", model)
    engine = Engine(EngineOptions(model=model, backend="numpy", ctx=512, parallel=1))
    sock_dir = tmp / "run"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genie_daemon",
            "-m",
            model,
            "--backend",
            "numpy",
            "--ctx",
            "512",
            "--socket-dir",
            str(sock_dir),
            "--stream-interval-ms",
            str(args.stream_interval_ms),
            "--kv-cache-dir",
            str(tmp / "kv"),
        ],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    endpoint = f"ipc://{sock_dir}/genie.sock"
    echo_endpoint = f"ipc://{tmp}/echo.sock"
    echo = subprocess.Popen([sys.executable, "-c", ECHO, echo_endpoint])
    try:
        info = asyncio.run(wait_ready(endpoint))
        # alternate the two, so drift in the machine's speed hits both alike; medians of the runs
        local_runs, remote_runs, worker_runs, delta_counts = [], [], [], []
        first_local, first_remote, first_worker, bare = [], [], [], []
        for _ in range(args.repeats):
            per_token, first = in_process(engine, args.tokens)
            local_runs.append(per_token)
            first_local.append(first)
            bare.append(asyncio.run(bare_round_trips(echo_endpoint)))
            wall, worker_engine, deltas, first, worker_first = asyncio.run(through_daemon(endpoint, args.tokens))
            remote_runs.append(wall)
            worker_runs.append(worker_engine)
            delta_counts.append(deltas)
            first_remote.append(first)
            first_worker.append(worker_first)
        local, remote = statistics.median(local_runs), statistics.median(remote_runs)
        worker = statistics.median(worker_runs)
        pids = [daemon.pid, info["worker_pid"]] + ([info["kv_store_pid"]] if info.get("kv_store_pid") else [])
        before = [cpu_seconds(pid) for pid in pids]
        time.sleep(args.idle_s)
        used = sum(cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True))
    finally:
        echo.kill()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    print(f"model {Path(model).name}, {args.tokens} tokens, median of {args.repeats} alternating runs each\n")
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| decode per token, in process | {local * 1e6:.0f} µs | |")
    print(f"| decode per token, through the daemon | {remote * 1e6:.0f} µs | |")
    print(f"| … of which the worker's engine (its own timing) | {worker * 1e6:.0f} µs | |")
    n_deltas = statistics.median(delta_counts)
    print(f"| DELTAs per request (stream interval {args.stream_interval_ms:g} ms) | {n_deltas:.0f} | |")
    print(f"| daemon hop per token (through the daemon − in process) | {(remote - local) * 1e6:.0f} µs | ≤ 100 µs |")
    t_local, t_remote = statistics.median(first_local), statistics.median(first_remote)
    print(f"| first token, in process (call → first event) | {t_local * 1e3:.2f} ms | |")
    print(f"| first token, through the daemon (send → first DELTA) | {t_remote * 1e3:.2f} ms | |")
    print(f"| … of which the worker's engine (its own timing) | {statistics.median(first_worker) * 1e3:.2f} ms | |")
    hop = t_remote - t_local
    idle, awake = (statistics.median(b[i] for b in bare) for i in range(2))
    rtts = f"{idle * 1e6:.0f} / {awake * 1e6:.0f} µs"
    print(f"| bare round trip, pyzmq DEALER/ROUTER over ipc: the echo idle / awake | {rtts} | |")
    print(f"| daemon hop to the first token | {hop * 1e3:.2f} ms = {hop / idle:.1f} idle round trips | ≤ 2 |")
    who = "daemon + worker + KV store" if len(pids) == 3 else "daemon + worker"
    print(f"| idle CPU, {who}, {args.idle_s:.0f} s | {100 * used / args.idle_s:.2f} % of a core | ≤ 1 % |")


if __name__ == "__main__":
    main()
