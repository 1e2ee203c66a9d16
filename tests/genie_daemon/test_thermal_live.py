"""Heat through the real daemon and worker (issue 18): a sensor file at 85 000 m°C and the daemon says
"throttled" and decodes slower; at 40 000 it is back to full speed within 5 s."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from protocol.client import GenieClient
from protocol.messages import Done
from tests.genie_daemon.test_daemon import collect, start_daemon, status

REQUEST = {"token_ids": [1, *range(40, 60)], "params": {"temperature": 0.0, "max_tokens": 120, "ignore_eos": True}}


def decode_tok_s(endpoint: str) -> float:
    async def go():
        async with GenieClient(endpoint, timeout_s=60) as client:
            return await collect(client, **REQUEST)

    _, done = asyncio.run(go())
    assert isinstance(done, Done) and done.usage["completion_tokens"] == 120
    return float(done.timings["decode_tok_s"])


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
        cool = decode_tok_s(endpoint)
        sensor.write_text("85000\n")
        _, thermal = wait_for_thermal(endpoint, True, 5)
        assert thermal["temp_c"] == 85.0
        hot = decode_tok_s(endpoint)
        assert hot < 0.7 * cool, (hot, cool)  # a pause as long as each step: about half the speed
        sensor.write_text("40000\n")
        took, _ = wait_for_thermal(endpoint, False, 5)
        assert took < 5
        assert decode_tok_s(endpoint) > 0.7 * cool
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
