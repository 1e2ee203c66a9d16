"""Faults that once wedged or leaked the service (issue 21): a request sent while a hung worker is being
replaced, and a daemon killed with SIGKILL in the middle of an answer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from genie_protocol.client import GenieClient
from genie_protocol.messages import Delta, Done, Error
from tests.genie_daemon.test_daemon import collect, ctl, start_daemon


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def test_requests_sent_while_a_hung_worker_is_replaced_are_all_answered(tmp_path):
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    try:
        pid = json.loads(ctl(sock_dir, "--json", "status").stdout)["worker_pid"]
        long = {"token_ids": [1] + list(range(3, 60)), "params": {"max_tokens": 400, "ignore_eos": True}}
        short = {"token_ids": [1, 5, 6, 7], "params": {"max_tokens": 3, "ignore_eos": True}}

        async def go() -> list:
            async with GenieClient(endpoint, timeout_s=60) as client:
                ends = []
                async for ev in client.generate(**long):
                    if isinstance(ev, Delta):
                        os.kill(pid, signal.SIGSTOP)  # hung: no more heartbeats, no more answers
                    else:
                        ends.append(ev)
                # at once, in the restart window, then after it
                window = await asyncio.gather(*(collect(client, **short) for _ in range(3)))
                ends += [end for _, end in window]
                ends.append((await collect(client, **short))[1])
                return ends

        ends = asyncio.run(go())
        assert isinstance(ends[0], Error) and ends[0].code == "worker_died", ends[0]
        assert all(isinstance(e, Done) for e in ends[1:]), ends
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert status["ready"] and status["running"] == 0 and status["queue"] == 0, status
        assert status["worker_restarts"] == 1 and status["worker_pid"] != pid
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_no_child_outlives_a_daemon_killed_mid_answer(tmp_path):
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=2048, backend="numpy", ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    status = json.loads(ctl(sock_dir, "--json", "status").stdout)
    children = [status["worker_pid"], status["kv_store_pid"]]

    async def go() -> None:
        params = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}
        async with GenieClient(endpoint, timeout_s=5) as client:
            async for ev in client.generate(prompt="Tell a long story.", params=params, conv_id="attic"):
                if isinstance(ev, Delta):
                    proc.kill()  # SIGKILL: no handler runs, nothing is cleaned up by the daemon
                    return

    try:
        asyncio.run(go())
        proc.communicate(timeout=10)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if alive(pid)], "a child of the killed daemon is still running"
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_store_that_stops_answering_is_restarted(tmp_path):
    """A store stuck without exiting (a FIFO it opened, a hung disk) cost every turn its lookup timeout and
    lost every save, and the daemon never noticed (issue 21 item 4)."""
    config = tmp_path / "genie.toml"
    config.write_text("kv_store_timeout_s = 1.5\n")
    proc, endpoint = start_daemon(tmp_path, "--config", str(config))
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    stuck = json.loads(ctl(sock_dir, "--json", "status").stdout)["kv_store_pid"]
    try:
        os.kill(stuck, signal.SIGSTOP)
        deadline = time.monotonic() + 30  # a hang guard
        while time.monotonic() < deadline:
            status = json.loads(ctl(sock_dir, "--json", "status").stdout)
            if status["kv_store_pid"] != stuck and "hits" in status["kv"]:
                break
            time.sleep(0.2)
        assert status["kv_store_pid"] != stuck and status["kv"]["restarts"] == 1, status
        assert not alive(stuck)
        assert "event=kv_store_unresponsive" in stop_and_log(proc)
    finally:
        try:
            os.kill(stuck, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_and_log(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return err


def test_requests_that_had_no_answer_yet_run_again_on_the_replacement(tmp_path):
    """Issue 34 item 5: with the worker stopped (SIGSTOP) past the heartbeat timeout, 4 of 6 requests sent
    meanwhile got worker_died. A request that has had no DELTA yet now runs again on the new worker."""
    proc, endpoint = start_daemon(tmp_path)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    pid = json.loads(ctl(sock_dir, "--json", "status").stdout)["worker_pid"]
    short = {"token_ids": [1, 5, 6, 7], "params": {"max_tokens": 4, "ignore_eos": True}}
    try:
        os.kill(pid, signal.SIGSTOP)  # hung: it takes requests (its socket is there) and answers none

        async def go() -> list:
            async with GenieClient(endpoint, timeout_s=60) as client:
                return await asyncio.gather(*(collect(client, **short) for _ in range(6)))

        ends = [end for _, end in asyncio.run(go())]
        got = [e.code if isinstance(e, Error) else e.usage["completion_tokens"] for e in ends]
        assert got == [4] * 6, got  # every one answered whole (an ERROR shows its code)
        status = json.loads(ctl(sock_dir, "--json", "status").stdout)
        assert status["worker_restarts"] == 1 and status["worker_pid"] != pid, status
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_request_runs_again_once_only(tmp_path):
    """The second worker that dies under the same request before its first DELTA ends it with worker_died:
    a request that kills workers must not kill them for ever."""
    proc, endpoint = start_daemon(tmp_path, model="gemma3-270m", ctx=2048, backend="numpy", ready_timeout_s=120)
    sock_dir = Path(endpoint[len("ipc://") :]).parent
    prompt = "Tell me everything about lighthouses and the sea. " * 60  # a prefill of seconds on 2 cores
    killed: list[int] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = json.loads(ctl(sock_dir, "--json", "status").stdout)
            if status["ready"] and status["running"] == 1 and status["worker_pid"] not in killed:
                os.kill(status["worker_pid"], signal.SIGKILL)  # in its prefill: no DELTA sent yet
                killed.append(status["worker_pid"])
                return
            time.sleep(0.05)
        raise AssertionError("the request never ran")

    async def go() -> tuple[list, object]:
        async with GenieClient(endpoint, timeout_s=120) as client:
            task = asyncio.create_task(collect(client, prompt=prompt, params={"max_tokens": 4}))
            for _ in range(2):
                await asyncio.to_thread(kill_when_running)
            return await task

    try:
        deltas, end = asyncio.run(go())
        assert not deltas and isinstance(end, Error) and end.code == "worker_died", (deltas, end)
        assert len(killed) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
