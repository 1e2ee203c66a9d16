"""KvStoreHandle's restart backoff: doubling while the store keeps crashing, back to the first delay once it
has run stably (issue 21 item 6: after five crashes every later one cost 10 s, however long the run before).
Time is injected: no test here sleeps."""

from __future__ import annotations

import asyncio

import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_daemon import kv_store_handle
from genie_daemon.kv_store_handle import KvStoreHandle


class FakeTime:
    def __init__(self) -> None:
        self.now_s = 1000.0
        self.slept_s: list[float] = []

    def monotonic(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        self.slept_s.append(seconds)
        self.now_s += seconds


class FakeProcess:
    """What the handle uses of an asyncio subprocess."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def terminate(self) -> None:
        self.returncode = -15

    def kill(self) -> None:
        self.returncode = -9

    async def wait(self) -> int:
        return self.returncode or 0


def test_backoff_doubles_while_crashing_and_resets_after_a_stable_run(tmp_path, monkeypatch):
    spawned: list[FakeProcess] = []

    async def spawn(*args: object, **kw: object) -> FakeProcess:
        spawned.append(FakeProcess(len(spawned) + 1))
        return spawned[-1]

    monkeypatch.setattr(kv_store_handle.asyncio, "create_subprocess_exec", spawn)
    config = DaemonConfig(socket_dir=str(tmp_path), restart_backoff_s=0.5, restart_backoff_max_s=10.0)
    fake = FakeTime()

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        handle = KvStoreHandle(config, ctx, clock=fake.monotonic, sleep=fake.sleep, stable_after_s=60.0)
        await handle.start()

        async def crash_after(run_s: float) -> None:
            fake.now_s += run_s
            spawned[-1].returncode = 1
            await handle.restart()

        for _ in range(7):
            await crash_after(1.0)  # crashing at once: 0.5, 1, 2, 4, 8, 10, 10 s
        await crash_after(61.0)  # a stable minute: the next crash costs the first delay again
        await crash_after(1.0)  # and crashing at once doubles from there
        await crash_after(59.0)  # not yet stable (the 1 s delay before it is no run time)
        await handle.stop()
        ctx.term()

    asyncio.run(run())
    assert fake.slept_s == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 0.5, 1.0, 2.0]
    assert len(spawned) == 11
