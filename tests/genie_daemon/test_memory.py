"""What the worker holds after a burst of requests, through the real daemon on the default model (issue 34
item 13): the worker went 269 -> 616 MB over fuzz and load runs and kept it, idle. Most of it was the KV
pool, which NumPy backed with a 2 MB huge page in each slot of each pool array at its first row; the rest
free heap kept after the burst. The KV store, after 80 saves of up to 400-word prompts, held 40 -> 45 MB:
glibc had moved its mmap threshold above the saves' frames (genie_common/heap.py). Idle again, each must
hold within 10 % of what it held before."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from pathlib import Path

import pytest

from genie_protocol.client import GenieClient
from genie_protocol.messages import Done
from tests.genie_daemon.test_daemon import _rss_kb, collect, ctl, start_daemon

WORDS = "the a kitchen light is on off turn please what time weather today tomorrow music play stop".split()


# one burst in CI (44 s here; four took 171 s): without the KV store's map_large_blocks it still fails (39 -> 45 MB
# idle; issue 34 found 40 -> 46 over four); the soak variant keeps the four (bench/NOTES.md, session 2026-12-08)
@pytest.mark.parametrize("bursts", [1, pytest.param(4, marks=pytest.mark.soak)])
def test_idle_after_bursts_the_worker_and_kv_store_hold_what_they_held_before(tmp_path, bursts):
    # the model's own context (32 768 tokens), 4 slots: as a new user's daemon serves it
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=0, backend="numpy", ready_timeout_s=180)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    rng = random.Random(5)

    async def burst(n: int) -> list:
        async with GenieClient(endpoint, timeout_s=120) as client:
            prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 400))) for _ in range(n)]
            params = {"max_tokens": 6, "temperature": 0.0}
            return await asyncio.gather(*(collect(client, prompt=p, params=params) for p in prompts))

    try:
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert status["slots"]["total"] == 4, status
        pids = {"worker": status["worker_pid"], "kv store": status["kv_store_pid"]}
        asyncio.run(burst(1))  # the first request's one-time costs (a step's buffers) are not the burst's
        time.sleep(1.0)
        before = {name: _rss_kb(pid) for name, pid in pids.items()}
        for _ in range(bursts):  # 4 slots and max_queue 16
            ends = [end for _, end in asyncio.run(burst(20))]
            assert all(isinstance(e, Done) for e in ends), ends
        time.sleep(1.0)  # idle: each process gives back what the burst freed
        after = {name: _rss_kb(pid) for name, pid in pids.items()}
        held = {name: f"{before[name] / 1024:.0f} -> {after[name] / 1024:.0f} MB" for name in pids}
        assert all(after[name] <= before[name] * 1.10 for name in pids), held
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        finally:
            proc.kill()
