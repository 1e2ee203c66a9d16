"""Heat through the real daemon and worker (issue 18): a sensor file at 85 000 m°C and the daemon says
"throttled" and the worker pauses after every step of an answer; at 40 000 it says so within 5 s and pauses
no more. (Speeds are not asserted: bench-like figures are in the closing note; the pauses are counted.)"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from genie_protocol.client import GenieClient
from genie_protocol.messages import Done
from tests.genie_daemon.test_daemon import collect, start_daemon, status

REQUEST = {"token_ids": [1, *range(40, 60)], "params": {"temperature": 0.0, "max_tokens": 120, "ignore_eos": True}}


def answer(endpoint: str) -> None:
    async def go():
        async with GenieClient(endpoint, timeout_s=60) as client:
            return await collect(client, **REQUEST)

    _, done = asyncio.run(go())
    assert isinstance(done, Done) and done.usage["completion_tokens"] == 120


def paused(endpoint: str) -> int:
    return int(asyncio.run(status(endpoint)).data["thermal"]["paused_steps"])


def wait_for_thermal(endpoint: str, throttled: bool, within_s: float) -> tuple[float, dict]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        thermal = asyncio.run(status(endpoint)).data.get("thermal") or {}
        if thermal.get("throttled") is throttled:
            return time.monotonic() - t0, thermal
        time.sleep(0.1)
    raise AssertionError(f"thermal never became throttled={throttled} in {within_s} s: {thermal}")


def test_a_hot_sensor_slows_the_worker_down_and_a_cool_one_lets_it_go(tmp_path: Path) -> None:
    sensor = tmp_path / "temp"
    sensor.write_text("40000\n")
    config = tmp_path / "genie.toml"
    config.write_text(f'thermal_sensor = "{sensor}"\n')
    proc, endpoint = start_daemon(tmp_path, "--config", str(config))
    try:
        _, thermal = wait_for_thermal(endpoint, False, 5)
        assert thermal["temp_c"] == 40.0
        answer(endpoint)
        assert paused(endpoint) == 0
        sensor.write_text("85000\n")
        _, thermal = wait_for_thermal(endpoint, True, 5)
        assert thermal["temp_c"] == 85.0
        answer(endpoint)
        time.sleep(1.2)  # the next heartbeat carries the count
        hot = paused(endpoint)
        assert hot >= 120  # a pause after every step of the answer (its prefill and 119 decode steps)
        sensor.write_text("40000\n")
        took, _ = wait_for_thermal(endpoint, False, 5)
        assert took < 5
        answer(endpoint)
        time.sleep(1.2)
        assert paused(endpoint) == hot  # cool again: no step paused
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
